"""`rank_grid`: which process is which stage of which replica, and who talks to whom.

A job with `num_stages` pipeline stages and `data_parallel` replicas runs
num_stages × data_parallel processes. DeepSpeed lays them out with its own
``PipeDataParallelTopology`` (axes ``pipe`` then ``data``: the data axis varies fastest, so a
stage's replicas have neighbouring ranks, which puts the gradient all-reduce on the fast
links inside a node and the lighter point-to-point activations between nodes). The grid is
read from that class at run time, so it is the layout the job really gets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankGrid:
    """The process layout of a PP × DP job."""

    num_stages: int
    data_parallel: int
    coords: dict[int, tuple[int, int]]
    """rank -> (stage, replica)."""
    pipelines: list[list[int]]
    """One list per replica: its ranks in stage order. Neighbours in a list exchange
    activations (forward) and gradients (backward) point to point."""
    data_groups: list[list[int]]
    """One list per stage: the ranks holding that stage's layers in every replica. Each group
    all-reduces its gradients once per step (the ``ReduceGrads`` instruction)."""

    def rank(self, stage: int, replica: int = 0) -> int:
        return next(r for r, c in self.coords.items() if c == (stage, replica))

    def p2p_pairs(self) -> list[tuple[int, int]]:
        """(sender, receiver) of every forward activation send: stage s to s + 1 in each replica."""
        return [(a, b) for pipe in self.pipelines for a, b in zip(pipe, pipe[1:])]


def rank_grid(num_stages: int, data_parallel: int = 1) -> RankGrid:
    """The layout DeepSpeed's ``PipeDataParallelTopology`` gives `num_stages` × `data_parallel`
    processes (what `JobSpec(num_stages=..., data_parallel=...)` runs)."""
    from utils.system.dslog import quiet_accelerator_notice

    quiet_accelerator_notice()
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    for name, value in (("num_stages", num_stages), ("data_parallel", data_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=data_parallel)
    coords = {}
    for rank in range(topology.world_size()):
        coord = topology.get_coord(rank)
        coords[rank] = (coord.pipe, coord.data)
    return RankGrid(num_stages=num_stages, data_parallel=data_parallel, coords=coords,
                    pipelines=[list(g) for g in topology.get_axis_comm_lists("pipe")],
                    data_groups=[list(g) for g in topology.get_axis_comm_lists("data")])
