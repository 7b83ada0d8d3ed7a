"""The injectable faults without a job: `JobSpec.check` explains a bad one before launch, and
`utils.runtime.faults.FaultInjector` changes exactly the instructions it should (on a stand-in
engine). The memory cap, the stack dumps and their collection run in small subprocesses of
their own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from utils import Fault, JobSpec
from utils.jobs.rundir import RunDir
from utils.jobs.stacks import main_stack, parse_stacks, request_stacks
import utils.runtime.faults as faults_module
from utils.runtime.faults import FaultInjector, fault_injector

SMALL = {"model_options": {"blocks": 2}, "num_stages": 2}  # 4 layers
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fields, fault, message", [
    ({}, Fault(kind="slow", factor=1.0), r"slow fault's factor must be a number > 1"),
    ({}, Fault(kind="slow", factor="3"), r"slow fault's factor must be a number > 1"),
    ({}, Fault(kind="raise", factor=3.0), r"fault factor is for kind='slow' only; this fault is kind='raise'"),
    ({}, Fault(kind="memory", tensor="dtype"), r"fault tensor is for kind='mismatch' only"),
    ({}, Fault(kind="memory"), r"a memory fault needs cap_mb"),
    ({}, Fault(kind="memory", cap_mb=-5), r"a memory fault needs cap_mb.*got -5"),
    ({}, Fault(kind="hang", cap_mb=5), r"fault cap_mb is for kind='memory' only"),
    ({}, Fault(kind="mismatch", tensor="rank"), r"mismatch fault's tensor is one of \('shape', 'dtype'\)"),
    ({}, Fault(kind="mismatch", stage=1), r"stage 1 sends no activation on.*a stage before the last"),
    ({}, Fault(kind="mismatch", stage=0, instruction="backward"), r"stage 0 sends no gradient back.*after the first"),
    ({"num_stages": 1}, Fault(kind="mismatch"), r"sends no activation on \(1 stage"),
    ({}, Fault(kind="mismatch", instruction="send_act"), r"'mismatch' fault takes instruction 'forward'"),
    ({}, Fault(kind="slow", instruction="backward"), r"'slow' fault takes no instruction"),
    ({}, Fault(kind="slow", replica=1), r"fault replica 1 is outside 0..0 \(data_parallel=1\)"),
    ({}, Fault(kind="slow", replica=-1), r"fault.replica must be at least 0"),
    ({}, Fault(kind="teleport"), r"unknown fault kind 'teleport'"),
    ({"num_stages": 3}, Fault(kind="exhausted", stage=1), r"stage 1 loads no data.*needs stage 0 or 2"),
    ({}, Fault(kind="exhausted", instruction="load"), r"'exhausted' fault takes no instruction"),
    ({"num_stages": 1}, Fault(kind="collective"), r"a collective fault needs another rank"),
])
def test_bad_faults_are_explained_before_launch(fields, fault, message):
    with pytest.raises((ValueError, TypeError), match=message):
        JobSpec(**{**SMALL, **fields, "fault": fault}).check()


@pytest.mark.parametrize("fault", [
    Fault(kind="slow", stage=1, factor=2.5), Fault(kind="slow", stage=1, replica=1),
    Fault(kind="mismatch", stage=0, step=1), Fault(kind="mismatch", stage=1, instruction="backward", tensor="dtype"),
    Fault(kind="memory", stage=0, cap_mb=40), Fault(kind="raise", stage=1, replica=1, step=2),
    Fault(kind="exhausted", stage=0, step=1), Fault(kind="exhausted", stage=1, replica=1),
    Fault(kind="collective", stage=0, step=1, instruction="forward"),
])
def test_good_faults_pass_and_round_trip(fault):
    spec = JobSpec(**SMALL, data_parallel=2, steps=3, fault=fault)
    spec.check()
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    assert Fault(kind="slow").slowdown == 3.0 and Fault(kind="slow", factor=2).slowdown == 2.0


def test_the_fault_strikes_only_its_rank():
    spec = JobSpec(**SMALL, data_parallel=2, fault=Fault(kind="slow", stage=1, replica=1))
    assert fault_injector(spec, 1, 1, "cpu") is not None
    assert fault_injector(spec, 1, 0, "cpu") is None and fault_injector(spec, 0, 1, "cpu") is None
    assert fault_injector(JobSpec(**SMALL), 0, 0, "cpu") is None


# --- a stand-in engine: DeepSpeed's instruction classes by name, its buffers -----------------------------
def _instruction(name):
    return type(name, (), {})


ForwardPass, BackwardPass, SendActivation, SendGrad, OptimizerStep = map(
    _instruction, ["ForwardPass", "BackwardPass", "SendActivation", "SendGrad", "OptimizerStep"])


class Engine:
    def __init__(self, seconds=0.02, clock=time):
        self.sent, self.seconds, self.clock = [], seconds, clock
        self.pipe_buffers = {"outputs": [torch.zeros(2, 4, 3)], "inputs": [None]}
        x = torch.zeros(2, 4, 3, requires_grad=True)
        x.grad = torch.ones(2, 4, 3)
        self.pipe_buffers["inputs"][0] = x
        self._INSTRUCTION_MAP = {ForwardPass: Engine.compute, BackwardPass: Engine.compute,
                                 SendActivation: Engine.send_act, SendGrad: Engine.send_grad,
                                 OptimizerStep: Engine.compute}

    def compute(self, **kwargs):
        self.clock.sleep(self.seconds)

    def send_act(self, buffer_id):
        self.sent.append(self.pipe_buffers["outputs"][buffer_id])

    def send_grad(self, buffer_id):
        self.sent.append(self.pipe_buffers["inputs"][buffer_id].grad)
        self.pipe_buffers["inputs"][buffer_id] = None

    def run(self, injector, step, cls, kind, micro_batch=0, **kwargs):
        injector.before(step, kind, micro_batch)
        started = self.clock.perf_counter()
        self._INSTRUCTION_MAP[cls](self, **kwargs)
        return self.clock.perf_counter() - started


class VirtualClock:
    """`time.perf_counter` and `time.sleep` on a clock that only sleeping advances: the
    durations a test reads are the ones it asked for, on any machine."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_slow_fault_stretches_forward_and_backward_from_its_step(monkeypatch):
    # The injector's clock and sleep are a virtual clock (so are the stand-in engine's): each
    # instruction "takes" exactly the 20 ms it sleeps, and the fault adds (factor - 1) times
    # what it timed. Real sleeps were asserted to 20 ms here, which a loaded machine stretches.
    clock = VirtualClock()
    monkeypatch.setattr(faults_module, "time", clock)
    engine = Engine(clock=clock)
    injector = FaultInjector(Fault(kind="slow", step=1, factor=3.0), 0, "cpu")
    injector.install(engine)
    assert engine.run(injector, 0, ForwardPass, "forward") == pytest.approx(0.02)  # before its step: as ever
    assert engine.run(injector, 1, ForwardPass, "forward") == pytest.approx(0.06)
    assert engine.run(injector, 2, BackwardPass, "backward") == pytest.approx(0.06)
    assert engine.run(injector, 2, OptimizerStep, "optimizer_step", None) == pytest.approx(0.02)


@pytest.mark.parametrize("what, shape, dtype", [("shape", (2, 5, 3), torch.float32), ("dtype", (2, 4, 3), torch.float64)])
def test_a_mismatch_fault_sends_one_wrong_activation(what, shape, dtype):
    engine = Engine()
    kept = engine.pipe_buffers["outputs"][0]
    injector = FaultInjector(Fault(kind="mismatch", step=1, tensor=what if what == "dtype" else None), 0, "cpu")
    injector.install(engine)
    engine.run(injector, 0, SendActivation, "send_act", buffer_id=0)
    engine.run(injector, 1, SendActivation, "send_act", 1, buffer_id=0)  # micro-batch 1: untouched
    engine.run(injector, 1, SendActivation, "send_act", 0, buffer_id=0)
    assert [tuple(t.shape) for t in engine.sent[:2]] == [(2, 4, 3)] * 2
    assert tuple(engine.sent[2].shape) == shape and engine.sent[2].dtype == dtype
    assert engine.pipe_buffers["outputs"][0] is kept  # the sender's own backward still has its output


def test_a_mismatch_fault_on_the_backward_sends_a_wrong_gradient():
    engine = Engine()
    injector = FaultInjector(Fault(kind="mismatch", stage=1, instruction="backward"), 1, "cpu")
    injector.install(engine)
    engine.run(injector, 0, SendGrad, "send_grad", buffer_id=0)
    assert tuple(engine.sent[0].shape) == (2, 5, 3)


def test_an_exhausted_fault_empties_the_loader_as_its_step_starts():
    class LoadMicroBatch:
        pass

    class Loading:
        """DeepSpeed's way: train_batch sets the iterator, LoadMicroBatch calls next() on it."""

        def __init__(self):
            self.data_iterator, self.loaded = None, []
            self._INSTRUCTION_MAP = {LoadMicroBatch: Loading.load}

        def load(self, buffer_id):
            self.loaded.append(next(self.data_iterator))

        def train_batch(self, injector, step, data):
            self.data_iterator = data
            for micro_batch in range(2):
                injector.before(step, "load", micro_batch)
                self._INSTRUCTION_MAP[LoadMicroBatch](self, buffer_id=0)

    engine, data = Loading(), iter(range(100))
    injector = FaultInjector(Fault(kind="exhausted", step=1), 0, "cpu")
    injector.install(engine)
    engine.train_batch(injector, 0, data)
    with pytest.raises(StopIteration):
        engine.train_batch(injector, 1, data)
    assert engine.loaded == [0, 1]  # step 0 as ever; step 1 fails at its first load


def test_the_classic_faults_strike_as_their_instruction_starts():
    injector = FaultInjector(Fault(kind="raise", step=1, instruction="backward"), 0, "cpu")
    injector.before(0, "backward", 0)
    injector.before(1, "forward", 0)
    injector.before(1, "backward", 1)
    with pytest.raises(RuntimeError, match="injected fault: stage 0 fails at step 1 in backward"):
        injector.before(1, "backward", 0)


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_a_memory_cap_fails_a_large_allocation_with_the_allocators_error_and_lifts():
    done = _python("""
        import torch
        from utils import Fault
        from utils.runtime.faults import FaultInjector, lift_memory_cap
        injector = FaultInjector(Fault(kind="memory", cap_mb=50), 0, "cpu")
        small = torch.ones(2**20)                      # 4 MB before the cap: fine
        injector.before(0, "forward", 0)               # the cap: 50 MB more from here
        try:
            torch.ones(40 * 2**20)                     # 160 MB
        except RuntimeError as exc:
            print("FAILED:", str(exc).splitlines()[0])
        lift_memory_cap()
        print("AFTER:", torch.ones(40 * 2**20).numel())
    """)
    assert "DefaultCPUAllocator: can't allocate memory" in done.stdout, done.stdout + done.stderr
    assert "injected fault: stage 0 may allocate at most 50 MB more from step 0 on" in done.stdout
    assert f"AFTER: {40 * 2**20}" in done.stdout


def test_stacks_are_dumped_on_the_signal_and_collected(tmp_path):
    run_dir = RunDir(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from utils.jobs.rundir import RunDir
        from utils.runtime.lifecycle import dump_stacks_on_signal
        dump_stacks_on_signal(RunDir({str(tmp_path)!r}))
        def stuck_here():
            while True:
                time.sleep(0.05)
        stuck_here()
    """)], cwd=ROOT, env={"RANK": "3", "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.time() + 30
        while not run_dir.stacks_file(3).exists() and time.time() < deadline:
            time.sleep(0.05)
        process = psutil.Process(child.pid)
        first = request_stacks(run_dir, {3: process, 4: process})  # rank 4 has no file: never signalled
        assert set(first) == {3}
        main = main_stack(parse_stacks(first[3]))
        assert main is not None and main.frames[0].function == "stuck_here"
        second = request_stacks(run_dir, {3: process})
        assert "stuck_here" in second[3] and run_dir.stacks(3).count("stuck_here") == 2
        assert child.poll() is None  # the signal asked for stacks, it did not end the process
        # A stopped process cannot answer: the request gives up after its wait, with nothing.
        process.send_signal(signal.SIGSTOP)
        started = time.time()
        assert request_stacks(run_dir, {3: process}, wait=0.5) == {3: ""}
        # timing-claim: margin — the request sleeps its wait (0.5 s); what a 3x slower, oversubscribed machine adds is a few stat() calls and sleeps of 50 ms (well under 0.5 s), so 1.5 s of slack holds, while the default wait (2 s) would fail it
        assert time.time() - started < 2
    finally:
        child.kill()
        child.wait()
