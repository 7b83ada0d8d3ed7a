"""Where a job's ranks run: its nodes, DeepSpeed's hostfile format, and which ranks each
node holds.

A job on one machine has one node. ``JobSpec(hosts=[...])`` or ``JobSpec(hostfile=...)``
spreads it over several, each running ``world_size / nodes`` ranks (torchrun's
``--nproc-per-node`` is one number for every node). Global ranks go node by node, so with
DeepSpeed's stage-major layout (rank = stage × data_parallel + replica) a node holds whole
consecutive stages when the ranks per node are a multiple of data_parallel.

Which node is node 0 depends on the launcher, and this module says it as the launchers do it:

* ``torchrun`` with a c10d rendezvous ignores ``--node-rank``: it numbers the agents by
  sorting their node descriptors, whose first field is the agent's ``--local-addr``
  (``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``:
  ``for rank, node in enumerate(sorted(state.participants))``). The launchers pass each
  host as its ``--local-addr``, so nodes are numbered in the sorted order of the host names.
* DeepSpeed's runner numbers the hosts in hostfile order (``--node_rank=%n`` under pdsh).

Every rank also records where it really ran (`utils.jobs.rundir.RunDir.write_placement`),
so a run's placement is measured, not assumed.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import psutil

LauncherName = Literal["torchrun", "deepspeed"]
"""Who starts the ranks: ``"torchrun"`` (PyTorch's elastic launcher; one agent per node,
c10d rendezvous) or ``"deepspeed"`` (DeepSpeed's runner with a hostfile; pdsh + ssh reach
the other hosts)."""
LAUNCHERS: tuple[str, ...] = get_args(LauncherName)


@dataclass(frozen=True)
class Node:
    """One machine of a job and the global ranks it runs."""

    index: int
    """The node's rank among the nodes (torchrun's ``GROUP_RANK``, DeepSpeed's ``--node_rank``)."""
    host: str
    """Its address or host name, as given in ``hosts`` or the hostfile."""
    ranks: tuple[int, ...]
    """Global ranks on it, consecutive."""

    @property
    def slots(self) -> int:
        return len(self.ranks)


def parse_hostfile(text: str, *, source: str = "hostfile") -> list[tuple[str, int]]:
    """``[(host, slots), ...]`` from DeepSpeed's hostfile format: one ``host slots=N`` per
    line, ``#`` starts a comment, blank lines are skipped (as ``deepspeed.launcher.runner.
    fetch_hostfile`` reads it). Raises ValueError naming the line for anything else."""
    found: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = parts[1].partition("slots=")[2] if len(parts) == 2 else ""
        if not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"{source} line {number} is {raw.strip()!r}; DeepSpeed's hostfile format is "
                             "'HOST slots=N' with N >= 1, e.g. 'node1 slots=2'")
        if any(host == parts[0] for host, _ in found):
            raise ValueError(f"{source} line {number} names host {parts[0]!r} a second time; list every host once")
        found.append((parts[0], int(slots)))
    if not found:
        raise ValueError(f"{source} lists no host; write one 'HOST slots=N' line per node")
    return found


def read_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """`parse_hostfile` of a file, with an error that names the file when it cannot be read."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read hostfile {str(path)!r} ({exc.strerror or exc}); give the path of a "
                         "file with one 'HOST slots=N' line per node") from None
    return parse_hostfile(text, source=f"hostfile {path}")


def host_slots(spec) -> list[tuple[str, int]]:
    """The job's ``(host, slots)`` as given: its hostfile, or its hosts with an equal share of
    the ranks each, or this machine alone (``localhost``)."""
    if spec.hostfile is not None:
        return read_hostfile(spec.hostfile)
    if spec.hosts:
        return [(host, spec.world_size // len(spec.hosts)) for host in spec.hosts]
    return [("localhost", spec.world_size)]


def job_nodes(spec) -> tuple[Node, ...]:
    """The job's nodes numbered as its launcher numbers them (see the module docstring),
    each with its consecutive global ranks. Call after `check_nodes`."""
    pairs = host_slots(spec)
    if spec.launcher == "torchrun":
        pairs = sorted(pairs)
    nodes, first = [], 0
    for index, (host, slots) in enumerate(pairs):
        nodes.append(Node(index, host, tuple(range(first, first + slots))))
        first += slots
    return tuple(nodes)


def check_nodes(spec) -> None:
    """The placement fields: a known launcher, hosts or a hostfile (not both), every slot
    filled by exactly one rank, equal slots under torchrun, a positive join timeout."""
    if spec.launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {spec.launcher!r}; choose one of {LAUNCHERS}")
    if isinstance(spec.hosts, str) or not all(isinstance(h, str) and h.strip() == h and h for h in spec.hosts):
        raise TypeError(f"hosts must be a list of host names or addresses such as ['node1', 'node2'], "
                        f"got {spec.hosts!r} (a hostfile path goes in hostfile=)")
    if spec.hosts and spec.hostfile is not None:
        raise ValueError("give either hosts=[...] or hostfile=PATH, not both: they say the same thing twice")
    if len(set(spec.hosts)) != len(spec.hosts):
        raise ValueError(f"hosts {list(spec.hosts)} name a host twice; list every node once "
                         "(on one machine, use loopback addresses 127.0.0.1, 127.0.0.2, ... as separate nodes)")
    if spec.hosts and spec.world_size % len(spec.hosts):
        raise ValueError(f"{spec.world_size} ranks (num_stages × data_parallel) do not split evenly over "
                         f"{len(spec.hosts)} hosts; use a host count that divides {spec.world_size}")
    pairs = host_slots(spec)
    total = sum(slots for _, slots in pairs)
    if total != spec.world_size:
        raise ValueError(f"the hostfile offers {total} slots but the job has {spec.world_size} ranks "
                         f"(num_stages × data_parallel = {spec.num_stages} × {spec.data_parallel}); "
                         "make the slots add up to the rank count")
    if spec.launcher == "torchrun" and len({slots for _, slots in pairs}) > 1:
        raise ValueError(f"torchrun starts the same number of ranks on every node (--nproc-per-node), but the "
                         f"hostfile gives {dict(pairs)}; give every host the same slots, or launcher='deepspeed'")
    if isinstance(spec.join_timeout, bool) or not isinstance(spec.join_timeout, (int, float)) \
            or not 0 < spec.join_timeout < float("inf"):
        raise ValueError(f"join_timeout must be a number of seconds > 0 such as 60, got {spec.join_timeout!r}")
    if len(pairs) > 1 and spec.repartition_mode == "restart" and (spec.repartition_at or spec.rebalance):
        raise ValueError("repartition_mode='restart' relaunches the job on this machine; across nodes use "
                         "repartition_mode='live' (the ranks stay up and move layers between them)")


def is_local_host(host: str) -> bool:
    """True when `host` is this machine: ``localhost``, a loopback address (any of 127.0.0.0/8
    on Linux, so 127.0.0.2 can play a second node), this machine's names or one of its
    interface addresses."""
    if host == "localhost":
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    own = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return host in own


def cross_node_boundaries(nodes: Sequence[Node], num_stages: int, data_parallel: int) -> list[int]:
    """Stage boundaries (``s`` for the cut between stage s and s + 1) where some replica's
    activation leaves its node: the links a partition should charge at the cross-node price."""
    node_of = {rank: node.index for node in nodes for rank in node.ranks}
    return [s for s in range(num_stages - 1)
            if any(node_of[s * data_parallel + r] != node_of[(s + 1) * data_parallel + r]
                   for r in range(data_parallel))]
