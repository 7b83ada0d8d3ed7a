"""The schedule catalogue: every record builds valid orders, its bubble formula agrees with the
simulator inside its stated range, ZB-V equals torch's order, and no other module keeps its
own list of schedule facts."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from utils.planning.catalogue import CATALOGUE, SCHEDULE_NAMES, schedule_info, schedules_on
from utils.planning.schedules import build_schedule
from utils.planning.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]


def test_names_runtimes_and_refusals():
    assert SCHEDULE_NAMES == ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipev", "zbv")
    assert schedules_on("deepspeed") == ("gpipe", "1f1b")
    assert schedules_on("torch") == SCHEDULE_NAMES
    assert schedule_info(" ZBV ") is CATALOGUE["zbv"]
    with pytest.raises(ValueError, match="choose one of gpipe, 1f1b"):
        schedule_info("pipedream")
    with pytest.raises(ValueError, match="unknown runtime"):
        schedules_on("megatron")


def test_chunk_rules():
    inter, dpv, one = CATALOGUE["interleaved-1f1b"], CATALOGUE["dualpipev"], CATALOGUE["1f1b"]
    assert (inter.chunks_for(None), inter.chunks_for(3)) == (2, 3)
    assert (dpv.chunks_for(None), dpv.chunks_for(5)) == (2, 2)  # fixed: the knob does not apply
    assert one.chunks_for(4) == 1
    with pytest.raises(ValueError, match="chunks >= 2"):
        inter.check_chunks(1)
    with pytest.raises(ValueError, match="exactly 2"):
        dpv.check_chunks(3)
    with pytest.raises(ValueError, match="one model chunk per rank"):
        build_schedule("zb-h1", 2, 4, chunks=2)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_each_record_builds_its_schedule(name):
    info = schedule_info(name)
    s = build_schedule(name, 3, 6)
    assert (s.name, s.chunks, s.placement) == (name, info.default_chunks, info.placement)
    assert [[(a.virtual_stage, a.kind, a.micro_batch) for a in row] for row in s.actions] == \
        [list(row) for row in info.order(3, 6, info.default_chunks)]
    kinds = {a.kind for row in s.actions for a in row}
    assert info.split_backward == ("always" if "backward" not in kinds else
                                   "partly" if "backward_input" in kinds else "never")


def _minimum_m(name: str, p: int) -> int:
    return {"dualpipev": 2 * p, "zbv": 2 * p - 1}.get(name, p)


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if CATALOGUE[n].bubble_ratio])
def test_bubble_formula_equals_the_simulator_inside_its_range(name):
    # timing-claim: simulated — unit costs given to the simulator, no measurement
    info = schedule_info(name)
    for p in range(1, 7):
        for m in range(_minimum_m(name, p), 4 * p + 1):
            v = info.default_chunks
            try:
                s = build_schedule(name, p, m, chunks=v)
            except ValueError:  # interleaving rounds
                continue
            sim = simulate(s, 1.0, 1.0, weight=1.0 if s.split_backward else None)
            assert sim.metrics().bubble_ratio == pytest.approx(info.bubble_ratio(p, m, v), abs=1e-9), (p, m)


def _torch_zbv(p: int, m: int) -> dict[int, list[str]]:
    import torch
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    stages = [SimpleNamespace(num_stages=2 * p, group_size=p, group_rank=0, stage_index=k, is_first=k == 0,
                              is_last=k == 2 * p - 1, submod=torch.nn.Identity()) for k in (0, 2 * p - 1)]
    schedule = ScheduleZBVZeroBubble(stages, m)
    return {r: [str(a) for a in ops if a is not None] for r, ops in schedule.pipeline_order.items()}


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 1), (2, 3), (2, 4), (3, 2), (3, 5), (3, 9), (4, 7),
                                 (4, 8), (4, 13), (5, 10)])
def test_zbv_equals_torch(p, m):
    ours = build_schedule("zbv", p, m)
    assert {r: [str(a) for a in row] for r, row in enumerate(ours.actions)} == _torch_zbv(p, m)
    ours.validate()


def test_zbv_holds_no_more_activations_than_1f1b_with_the_same_work_per_rank():
    # ZB-V's promise (Qi et al., section 6): 1F1B's peak memory. Counted in chunk-sized sets:
    # 1F1B's first rank holds p micro-batches of a whole stage = 2p chunks' worth.
    for p in range(2, 6):
        s = build_schedule("zbv", p, 4 * p)
        assert max(s.in_flight(r) for r in range(p)) <= 2 * p


# --- one owner: no other module spells a schedule fact -------------------------------------------
ALLOWED = {
    ("utils/planning/whatif.py", "search_micro_batches"): "a default argument: the schedules DeepSpeed runs",
    ("utils/planning/whatif.py", "_time_search"): "the set a timing benchmark sweeps",
}


def _stray_lists() -> list[str]:
    names = set(SCHEDULE_NAMES)
    classes = {info.torch_class for info in CATALOGUE.values()}
    found = []
    for path in sorted((ROOT / "utils").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "utils/planning/catalogue.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owners = {}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    owners.setdefault(id(node), fn.name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                hits = [e.value for e in items if isinstance(e, ast.Constant) and e.value in names]
                if len(hits) >= 2 and (rel, owners.get(id(node))) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} lists schedules {hits}")
            if isinstance(node, ast.Constant) and node.value in classes:
                found.append(f"{rel}:{node.lineno} names torch's {node.value}")
    return found


def test_no_module_keeps_its_own_list_of_schedules():
    assert _stray_lists() == []
