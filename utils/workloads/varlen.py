"""Variable-length samples for the gpt presets, batched into micro-batches by a plan.

Real language-model batches hold sequences of very different lengths. Here every sample has
its own length, drawn from a long-tailed distribution by default: log-normal with its median
at an eighth of the model's ``seq_len`` and sigma 1.0, clipped to [4, seq_len]. Log-normal
because document and conversation lengths in real corpora are close to it (most short, a
few near the context limit: the shape DynaPipe's FLAN and ShareGPT workloads have), which is
what makes padding to the longest wasteful. A list of lengths may be given instead (it is
cycled through).

A step's samples depend only on (seed, replica, step), so every rank that loads data — the
first stage (inputs) and the last (labels) — and every stage that needs the micro-batch count
computes the same plan without talking to the others, and a restarted job resumes exactly.

Padding is on the right and attention is causal, so a real token never attends to a pad; the
labels of pads are -100 (ignored). Packed micro-batches (``batching="packing"``) hold several
samples per row and come as ``(tokens, segments, positions)``: the segment of each token (its
sample's place in the row, -1 for a pad) for the block-diagonal mask, and its position inside
its own sample. Under DeepSpeed's dynamic batching (``"deepspeed"``) the samples a step takes
are decided over the whole stream (`utils.planning.microbatching.deepspeed_batches`): step k
trains DeepSpeed's k-th batch, more or fewer samples than the others' fixed count.

The loss is normalised by the real tokens of the replica's whole batch (`loss_per="token"`):
each micro-batch's loss is ``sum of its token losses × m / N`` (m micro-batches, N real tokens
in the step), and DeepSpeed's 1/m scaling of each micro-batch's backward then gives the
gradient of the per-token mean — the same for every batching method on the same samples. ``loss_per="micro-batch"`` averages inside each
micro-batch instead (what naive code does): its gradient depends on how the samples were cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from utils.planning.microbatching import MicroBatchCost, MicroBatchPlan, deepspeed_batches, plan_micro_batches, reorder
from utils.workloads.presets import draws_token_samples
from utils.workloads.recut import RecutBatches

PAD_LABEL = -100
MIN_LENGTH = 4


def sample_lengths(count: int, *, seq_len: int, generator: torch.Generator,
                   lengths: Sequence[int] | None = None, start: int = 0) -> list[int]:
    """`count` sample lengths: the long-tailed default, or the given `lengths` cycled from
    position `start`."""
    if lengths:
        return [int(lengths[(start + i) % len(lengths)]) for i in range(count)]
    lowest = min(MIN_LENGTH, seq_len)
    median = math.log(max(seq_len / 8, lowest))
    drawn = torch.empty(count, dtype=torch.float64).log_normal_(median, 1.0, generator=generator)
    return [int(min(seq_len, max(lowest, round(x)))) for x in drawn.tolist()]


class VarlenBatches:
    """The micro-batches of variable-length samples one replica trains on, step by step.

    `begin_step(step)` draws the step's samples and plans its micro-batches (returns their
    count); iterating yields ``(inputs, (labels, scale))`` for each in turn.
    """

    def __init__(self, *, vocab: int, seq_len: int, seed: int, replica: int, samples: int, micro_batches: int,
                 method: str, num_stages: int, cost: MicroBatchCost | None, token_budget: int | None = None,
                 lengths: Sequence[int] | None = None, loss_per: str = "token", order: str = "as-planned",
                 active: int = 256, steps: int = 0):
        self.vocab, self.seq_len, self.seed, self.replica = vocab, seq_len, seed, replica
        self.samples, self.micro_batches, self.method = samples, micro_batches, method
        self.num_stages, self.cost, self.token_budget = num_stages, cost, token_budget
        self.lengths, self.loss_per, self.order, self.active = lengths, loss_per, order, min(active, vocab)
        self.steps = steps
        self.step = -1
        self.plan: MicroBatchPlan | None = None
        self.real_tokens = 0
        self.step_lengths: list[int] = []
        self.step_samples = samples  # samples in the current step: `samples`, except under DeepSpeed's dynamic batching
        self._queue: list = []
        self._stream: list[MicroBatchPlan] | None = None  # DeepSpeed's batches of the whole stream
        self._drawn: tuple = (None, None)  # the last block of the stream drawn: (step, (lengths, tokens))

    def draw(self, step: int) -> tuple[list[int], torch.Tensor]:
        """The step's sample lengths and tokens (each sample one row, its length + 1 long)."""
        generator = torch.Generator().manual_seed((self.seed * 1000 + self.replica) * 100_003 + step)
        lengths = sample_lengths(self.samples, seq_len=self.seq_len, generator=generator, lengths=self.lengths,
                                 start=step * self.samples)
        start = torch.randint(0, self.active, (self.samples, 1), generator=generator)
        stride = torch.randint(1, 5, (self.samples, 1), generator=generator)
        tokens = (start + stride * torch.arange(self.seq_len + 1)) % self.active
        return lengths, tokens

    def begin_step(self, step: int) -> int:
        if self.method == "deepspeed":
            lengths, tokens, plan = self._deepspeed_step(step)
        else:
            lengths, tokens = self.draw(step)
            plan = plan_micro_batches(lengths, method=self.method, micro_batches=self.micro_batches,
                                      num_stages=self.num_stages, cost=self.cost, token_budget=self.token_budget,
                                      row_length=self.seq_len)
        if self.order != "as-planned":
            plan = reorder(plan, self.order, cost=self.cost, seed=self.seed * 100_003 + step)
        self.step, self.plan, self.real_tokens, self.step_lengths = step, plan, sum(lengths), lengths
        self.step_samples = len(lengths)
        m = plan.micro_batches
        self._queue = [self._micro_batch(plan, j, lengths, tokens) for j in range(m)][::-1]
        return m

    def _micro_batch(self, plan: MicroBatchPlan, j: int, lengths: list[int], tokens: torch.Tensor):
        """Micro-batch `j` of `plan`: ``(inputs, (labels, scale))``; packed inputs are
        ``(tokens, segments, positions)`` (`utils.workloads.layers`: -1 marks a pad)."""
        rows = plan.rows[j] if plan.rows is not None else tuple((i,) for i in plan.groups[j])
        width = plan.padded[j]
        inputs = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), PAD_LABEL, dtype=torch.long)
        segments = torch.full((len(rows), width), -1, dtype=torch.long)
        positions = torch.zeros(len(rows), width, dtype=torch.long)
        for r, row in enumerate(rows):
            at = 0
            for k, sample in enumerate(row):
                length = lengths[sample]
                inputs[r, at:at + length] = tokens[sample, :length]
                labels[r, at:at + length] = tokens[sample, 1:length + 1]
                segments[r, at:at + length] = k
                positions[r, at:at + length] = torch.arange(length)
                at += length
        real = sum(lengths[s] for s in plan.groups[j])
        scale = plan.micro_batches / self.real_tokens if self.loss_per == "token" else 1.0 / real
        packed = plan.rows is not None
        return ((inputs, segments, positions) if packed else inputs), (labels, torch.tensor(scale, dtype=torch.float32))

    def _deepspeed_step(self, step: int) -> tuple[list[int], torch.Tensor, MicroBatchPlan]:
        """Step `step` of DeepSpeed's dynamic batching (`deepspeed_batches`), planned once over
        the stream of every step's draws (more are drawn until the stream holds one batch more
        than the run's steps: ``batch_by_seqlens`` takes each batch as long as its cap allows, so
        only the last batch depends on where the stream ends);
        returns the step's own samples (lengths, tokens) and its plan over them."""
        if self._stream is None:
            blocks = max(1, self.steps)
            while True:
                stream = [x for b in range(blocks) for x in self.draw(b)[0]]
                plans, _ = deepspeed_batches(stream, micro_batches=self.micro_batches, max_tokens=self.token_budget)
                if len(plans) > max(1, self.steps):  # one more than needed: the stream's end cuts only that one
                    break
                blocks *= 2
            self._stream = plans
        plans = self._stream
        if step >= len(plans):
            raise RuntimeError(f"DeepSpeed's dynamic batching planned {len(plans)} steps; step {step} has none")
        stream_plan = plans[step]
        samples = [i for g in stream_plan.groups for i in g]
        local = {i: k for k, i in enumerate(samples)}
        lengths, rows = [], []
        for i in samples:
            block_lengths, block_tokens = self._block(i // self.samples)
            lengths.append(block_lengths[i % self.samples])
            rows.append(block_tokens[i % self.samples])
        plan = MicroBatchPlan(tuple(tuple(local[i] for i in g) for g in stream_plan.groups), stream_plan.padded)
        return lengths, torch.stack(rows), plan

    def _block(self, block: int):
        if self._drawn[0] != block:
            self._drawn = (block, self.draw(block))
        return self._drawn[1]

    def __iter__(self) -> VarlenBatches:
        return self

    def __next__(self):
        if not self._queue:
            raise RuntimeError(f"step {self.step} asked for more micro-batches than its plan has "
                               f"({self.plan.micro_batches if self.plan else 0}); begin_step was not called?")
        return self._queue.pop()

    def state(self) -> dict:
        return {"step": self.step}  # every step's samples follow from (seed, replica, step)

    def restore(self, state: dict) -> None:
        pass


OVERHEAD_TOKENS = 256
"""What a micro-batch costs a stage whatever its size, in tokens of compute: DeepSpeed's
instructions around it, the send and the receive. Measured on the 2-core CPU VM with the gpt
preset (`benchmarks/dynamic_microbatch.py` prints the fit); it is what keeps a token-budget
plan from cutting a batch into many tiny micro-batches."""


def default_cost(model) -> MicroBatchCost:
    """A cost model in token units for a gpt preset: linear in tokens (the projections and
    MLP: 24 h^2 flops per token per block) plus attention (4 L h per token), plus the fixed
    `OVERHEAD_TOKENS` per micro-batch. Only ratios matter to the plan."""
    hidden = model.options["hidden"]
    return MicroBatchCost(overhead=float(OVERHEAD_TOKENS), per_token=1.0, per_token_pair=4.0 / (24.0 * hidden))


def policy_overhead(policy, seq_len: int | None) -> float:
    """A `MicroBatchPolicy`'s fixed cost per micro-batch in samples: its own
    ``overhead_samples``, else `OVERHEAD_TOKENS` / ``seq_len`` (the language-model presets; the
    spec check refuses a policy without it on any other model)."""
    if policy.overhead_samples is not None:
        return float(policy.overhead_samples)
    return OVERHEAD_TOKENS / seq_len


def batches_for(spec, model, *, replica: int) -> VarlenBatches | RecutBatches:
    """The variable-length (or re-cut) micro-batches `spec` trains on, for one replica: token
    samples the workbook draws for its language-model presets, the model's own samples re-cut
    (`utils.workloads.recut`) for any other model."""
    if not draws_token_samples(model.preset, model.seq_len):
        return RecutBatches(model, seed=spec.seed, replica=replica, micro_batch_size=spec.micro_batch_size,
                            micro_batches=spec.micro_batches)
    return VarlenBatches(vocab=model.options["vocab"], seq_len=model.seq_len, seed=spec.seed, replica=replica,
                         samples=spec.micro_batch_size * spec.micro_batches, micro_batches=spec.micro_batches,
                         method=spec.batching, num_stages=spec.num_stages, cost=default_cost(model),
                         token_budget=spec.token_budget, loss_per=spec.loss_per, order=spec.micro_batch_order,
                         lengths=spec.lengths if spec.batching != "fixed" else (model.seq_len,), steps=spec.steps)
