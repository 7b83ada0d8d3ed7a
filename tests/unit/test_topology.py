"""`rank_grid`: DeepSpeed's PP × DP layout, and its picture."""

import pytest

from utils import JobSpec, plot_rank_grid, rank_grid


@pytest.mark.parametrize("p, d", [(1, 1), (2, 2), (4, 2), (3, 3)])
def test_the_grid_is_deepspeeds_stage_major_layout(p, d):
    grid = rank_grid(p, d)
    spec = JobSpec(num_stages=p, data_parallel=d, model_options={"blocks": 6})
    assert sorted(grid.coords) == list(range(p * d))
    for rank, (stage, replica) in grid.coords.items():
        assert rank == stage * d + replica == grid.rank(stage, replica)
        assert spec.stage_of_rank(rank) == stage
    assert grid.pipelines == [[s * d + r for s in range(p)] for r in range(d)]
    assert grid.data_groups == [[s * d + r for r in range(d)] for s in range(p)]
    assert len(grid.p2p_pairs()) == (p - 1) * d


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="data_parallel must be a whole number >= 1"):
        rank_grid(2, 0)


def test_the_picture_has_a_box_per_rank_and_an_all_reduce_per_stage():
    fig = plot_rank_grid(rank_grid(3, 2), lang="en")
    boxes = [s for s in fig.layout.shapes if s.type == "rect"]
    reduces = [a for a in fig.layout.annotations if "all-reduce" in (a.text or "")]
    assert len(boxes) == 6 and len(reduces) == 3
    assert list(fig.data[0].text) == [f"rank {r}" for r in range(6)]
    assert "6 processes" in fig.layout.title.text
