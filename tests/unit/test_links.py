"""Stage boundaries as links on hand-built timelines: the transfer part of each send/recv pair
per boundary (waiting for a late neighbour excluded), which boundaries cross nodes, and the
node named on each timeline row."""

from __future__ import annotations

import pytest

from utils import Event, Timeline, boundary_links, plot_timeline


def _timeline(transfer: dict[int, float], *, nodes: dict | None = None, wait: float = 0.004) -> Timeline:
    """4 stages, 2 micro-batches, step 1: stage s sends each activation to s + 1 and gets its
    gradient back; the receiver is inside its recv `wait` s before the send starts (a bubble,
    not transfer), and each pair then takes `transfer[s]` s."""
    events, t = [], 0.0
    for mb in range(2):
        for s in range(3):
            d = transfer[s]
            events += [Event(stage=s, rank=s, step=1, kind="send_act", micro_batch=mb, start=t, end=t + d),
                       Event(stage=s + 1, rank=s + 1, step=1, kind="recv_act", micro_batch=mb, start=t - wait,
                             end=t + d)]
            events += [Event(stage=s + 1, rank=s + 1, step=1, kind="send_grad", micro_batch=mb, start=t + 1,
                             end=t + 1 + 2 * d),
                       Event(stage=s, rank=s, step=1, kind="recv_grad", micro_batch=mb, start=t + 1, end=t + 1 + 2 * d)]
            t += 0.1
    return Timeline(events=tuple(events), num_stages=4, num_micro_batches=2, meta={"nodes": nodes or {}})


def test_each_boundary_reports_its_transfer_and_whether_it_crosses_nodes():
    links = boundary_links(_timeline({0: 0.001, 1: 0.005, 2: 0.001}, nodes={0: 0, 1: 0, 2: 1, 3: 1}))
    assert [link.stage for link in links] == [0, 1, 2]
    assert [link.cross_node for link in links] == [False, True, False]
    assert [link.nodes for link in links] == [(0, 0), (0, 1), (1, 1)]
    assert [link.activation_s for link in links] == pytest.approx([0.001, 0.005, 0.001])  # the wait is not transfer
    assert [link.gradient_s for link in links] == pytest.approx([0.002, 0.010, 0.002])
    assert all(link.transfers == 4 for link in links)
    slowest = max(links, key=lambda link: link.activation_s)
    assert slowest.cross_node and slowest.row()["boundary"] == "1|2" and slowest.row()["activation_ms"] == 5.0


def test_without_a_recorded_placement_nothing_is_called_cross_node():
    links = boundary_links(_timeline({0: 0.001, 1: 0.001, 2: 0.001}))
    assert all(link.nodes is None and not link.cross_node for link in links)


def test_timeline_rows_name_their_node():
    fig = plot_timeline(_timeline({0: 0.001, 1: 0.005, 2: 0.001}, nodes={"0": 0, "1": 0, "2": 1, "3": 1}), step=1)
    rows = list(fig.layout.yaxis.ticktext or fig.layout.yaxis.categoryarray)
    assert any("stage 2 · node 1" in row for row in rows) and any("stage 1 · node 0" in row for row in rows)
    plain = plot_timeline(_timeline({0: 0.001, 1: 0.005, 2: 0.001}), step=1)
    assert not any("node" in row for row in list(plain.layout.yaxis.ticktext or plain.layout.yaxis.categoryarray))


def test_a_link_prices_every_cut_by_its_bytes():
    link = boundary_links(_timeline({0: 0.001, 1: 0.005, 2: 0.001}))[1]
    assert link.link_cost([1000, 2000, 500], at_bytes=1000) == pytest.approx([0.005, 0.010, 0.0025])
