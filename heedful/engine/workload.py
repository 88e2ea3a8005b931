"""What a request will cost, known before any work: the counts a user gives (steps, samples,
ablations, generated tokens) checked against what the model and the memory budget allow, and an
estimate of the passes and seconds they take.

Passes come from the method's cost model (:attr:`~heedful.registry.MethodInfo.passes`: the
sequences sent forward and backward per example, from its options and the example's ``N``
tokens). Seconds come from the floating-point work of those passes and this machine's measured
speed: a pass over ``n`` tokens costs ``2 P n + 4 L D n^2`` operations forward (``P`` the
parameters the tokens run through -- every weight but the word embeddings and an untied head --
``L`` blocks of width ``D``: the ``q k^T`` and ``p v`` products) plus ``2 D C`` at the anchor
(the head's ``C`` outputs), a backward twice its forward (Kaplan et al. 2020, Scaling laws,
Sec. 2.1). The speed is a ``[256, D] x [D, F]`` product timed once per process and shape, times
:data:`EFFICIENCY` (what share of it a whole pass reaches). Generating a token reads every
weight for a single position: :data:`DECODE_EFFICIENCY` of that speed.

Memory: a method holds its copies of the examples (ids and mask ``[R, N]``, ``R`` the
forward rows) while it runs; :func:`check` refuses copies that cannot fit the adapter's
``max_memory``, and generation beyond the model's positions is refused by
:func:`heedful.engine.sequences.check_positions`, both before any pass.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import torch

from heedful.engine.memory import format_bytes
from heedful.engine.sequences import check_new_tokens, check_positions
from heedful.errors import InputError

LONG_SECONDS = 30.0
"""Work estimated above this many seconds is announced before it starts (the command line's
one line on stderr) and asked about (``heedful serve`` wants ``confirm``)."""
COPY_BYTES = 16
"""Bytes one copy holds per position while a method runs (its ids and mask, 8 bytes each)."""
EFFICIENCY = 0.5
"""Share of a single matrix product's speed that a whole batched pass reaches (norms,
softmax, copies; measured 0.4-0.7 on smollm2-135m, 2 threads)."""
DECODE_EFFICIENCY = 0.15
"""Share of that speed generation reaches: one position per step, every weight read once."""


@dataclass(frozen=True)
class Work:
    """What a run will cost, all examples together: ``forward`` / ``backward`` sequences sent
    through the model, of ``tokens`` positions on average; ``generated`` tokens written first,
    in ``generating`` of the ``seconds`` estimated on this machine."""

    forward: float
    backward: float
    tokens: float
    seconds: float
    generated: int = 0
    generating: float = 0.0

    @property
    def long(self) -> bool:
        """Above :data:`LONG_SECONDS`: announce it, ask before running it."""
        return self.seconds > LONG_SECONDS

    def describe(self) -> str:
        """``"about 4 min: 100,000 forward passes of 12 tokens"``."""
        parts = []
        if self.generated:
            parts.append(f"{self.generated:,} tokens to generate")
        if self.forward:
            what = f"{_count(self.forward)} forward"
            if self.backward:
                what += f" and {_count(self.backward)} backward"
            parts.append(f"{what} passes of {_count(self.tokens)} tokens")
        return f"about {duration(self.seconds)}: {', '.join(parts) or 'no pass'}"

    def explaining(self) -> Work:
        """The work after the generation (what another method adds to an explained generation)."""
        return replace(self, seconds=self.seconds - self.generating, generated=0, generating=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.describe()}

    def __add__(self, other: Work) -> Work:
        passes = self.forward + other.forward
        tokens = (self.tokens * self.forward + other.tokens * other.forward) / passes if passes else 0.0
        return Work(
            passes,
            self.backward + other.backward,
            tokens,
            self.seconds + other.seconds,
            self.generated + other.generated,
            self.generating + other.generating,
        )


NOTHING = Work(0.0, 0.0, 0.0, 0.0)


def _count(value: float) -> str:
    return f"{round(value):,}"


def duration(seconds: float) -> str:
    """``"40 s"``, ``"4 min"``, ``"2.5 h"``, ``"3 days"``: a rough duration."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{round(seconds / 86400):,} days"


# ---------------------------------------------------------------------------- the speed
@lru_cache(maxsize=16)
def _matmul_speed(hidden: int, intermediate: int, device: str, dtype: torch.dtype, threads: int) -> float:
    """Floating-point operations per second of a ``[256, D] x [D, F]`` product on ``device`` in
    ``dtype`` (its own generator: the global random state is left as it was)."""
    draw = torch.Generator().manual_seed(0)
    a = torch.rand(256, hidden, generator=draw, device="cpu").to(device, dtype)
    b = torch.rand(hidden, intermediate, generator=draw, device="cpu").to(device, dtype)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.mm(a, b)  # warm-up
    sync()
    reps, began = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - began < 0.02:
        torch.mm(a, b)
        reps += 1
    sync()
    return 2 * 256 * hidden * intermediate * reps / max(time.perf_counter() - began, 1e-9)


def speed(adapter) -> float:
    """Operations per second a batched pass of ``adapter``'s model reaches here (see the module
    docstring)."""
    shape = adapter.shape
    weight = next(adapter.hf_model.parameters())
    return EFFICIENCY * _matmul_speed(shape.hidden, shape.intermediate, str(weight.device), weight.dtype, torch.get_num_threads())


def _weights(adapter) -> int:
    """Parameters each token runs through: every weight but the word embeddings and an untied
    head (applied at the anchors only)."""
    found = getattr(adapter, "_heedful_weights", None)
    if found is None:
        model = adapter.hf_model
        seen = {id(p) for p in adapter.word_embeddings.parameters()}
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is not None:
            seen |= {id(p) for p in head.parameters()}
        found = sum(p.numel() for p in model.parameters() if id(p) not in seen)
        adapter._heedful_weights = found
    return found


def pass_flops(adapter, tokens: float) -> float:
    """Operations of one forward pass over ``tokens`` positions read at one anchor."""
    shape = adapter.shape
    return 2 * _weights(adapter) * tokens + 4 * shape.layers * shape.hidden * tokens**2 + 2 * shape.hidden * shape.outputs


# ---------------------------------------------------------------------------- estimates
def passes(info, bound: Mapping[str, Any], tokens: int) -> tuple[float, float]:
    """Sequences ``(forward, backward)`` the method ``info`` sends per example of ``tokens``
    positions with options ``bound``, the reference pass included (its cost model, else one
    forward and a backward for a method that keeps the reference's graph)."""
    if info.passes is not None:
        forward, backward = info.passes(bound, tokens)
        return float(forward), float(backward)
    return 1.0, 1.0 if info.reference is not None else 0.0


def method_work(adapter, info, bound: Mapping[str, Any], lengths: Sequence[int]) -> Work:
    """The estimated cost of ``info`` with ``bound`` options on examples of ``lengths`` tokens."""
    if not len(lengths):
        return NOTHING
    forward = backward = seconds = tokens = 0.0
    for n, count in Counter(int(n) for n in lengths).items():  # a generation's step rows share few lengths
        f, b = passes(info, bound, n)
        forward, backward = forward + count * f, backward + count * b
        seconds += count * pass_flops(adapter, n) * (f + 2 * b)
        tokens += count * n * f
    return Work(forward, backward, tokens / forward if forward else 0.0, seconds / speed(adapter))


def generation_work(adapter, prompt_lengths: Sequence[int], new_tokens: int) -> Work:
    """The estimated cost of writing ``new_tokens`` after each prompt (one batched prefill,
    then one position per step for every prompt)."""
    prompt_lengths = [int(n) for n in prompt_lengths]
    shape = adapter.shape
    prefill = sum(pass_flops(adapter, n) for n in prompt_lengths)
    width = max(prompt_lengths, default=0)
    per_step = len(prompt_lengths) * (2 * _weights(adapter) + 2 * shape.hidden * shape.outputs)
    context = 4 * shape.layers * shape.hidden * len(prompt_lengths) * (width * new_tokens + new_tokens**2 / 2)
    seconds = prefill / speed(adapter) + (per_step * new_tokens + context) / (DECODE_EFFICIENCY / EFFICIENCY * speed(adapter))
    return Work(0.0, 0.0, 0.0, seconds, new_tokens * len(prompt_lengths), seconds)


def step_lengths(prompt_lengths: Sequence[int], steps: int | Sequence[int]) -> list[int]:
    """The lengths of the step rows of ``steps`` tokens after each prompt (one count for all, or
    one per prompt): row ``t`` of prompt ``b`` holds ``P_b + t`` tokens
    (:func:`heedful.generation.step_rows`)."""
    counts = [steps] * len(prompt_lengths) if isinstance(steps, int) else list(steps)
    return [int(p) + t for p, n in zip(prompt_lengths, counts, strict=True) for t in range(n)]


# ---------------------------------------------------------------------------- checks
def check(adapter, info, bound: Mapping[str, Any], lengths: Sequence[int]) -> Work:
    """The estimated cost of ``info`` with ``bound`` options on examples of ``lengths`` tokens,
    or -- before any work -- an :class:`InputError` when the copies it holds while it runs
    (``R x N`` ids and mask, ``R`` its forward rows) cannot fit the adapter's ``max_memory``,
    naming the count to lower and how far."""
    work = method_work(adapter, info, bound, lengths)
    held = work.forward * work.tokens * COPY_BYTES
    budget = adapter.max_memory
    if held <= budget:
        return work
    counts = [s.name for s in info.options if s.name in COUNT_OPTIONS and isinstance(bound.get(s.name), int)]
    if counts:
        name = max(counts, key=lambda c: bound[c])
        value = bound[name]
        most = max(1, int(value * budget / held))
        what, fix = f"{name}={value:,}", f"use {name} <= {most:,}, or raise max_memory (--max-memory)"
    else:
        what, fix = "this input", "shorten the input, or raise max_memory (--max-memory)"
    raise InputError(
        f"{info.name}: {what} makes {_count(work.forward)} copies of {_count(work.tokens)} tokens, "
        f"about {format_bytes(held)} to hold; the memory budget is {format_bytes(budget)}",
        hint=fix,
    )


def check_generation(adapter, info, bound: Mapping[str, Any], prompt_lengths: Sequence[int], new_tokens: int) -> Work:
    """The estimated cost of generating ``new_tokens`` after each prompt and explaining every
    step with ``info``, or -- before anything is generated -- an :class:`InputError` when a
    prompt and ``new_tokens`` do not fit the model's positions, or the steps' copies do not fit
    the memory budget (:func:`check`)."""
    check_new_tokens(new_tokens)
    check_positions(adapter, prompt_lengths, [new_tokens] * len(prompt_lengths), generated=True)
    return generation_work(adapter, prompt_lengths, new_tokens) + check(adapter, info, bound, step_lengths(prompt_lengths, new_tokens))


COUNT_OPTIONS: dict[str, str] = {
    "n_steps": "steps",
    "max_steps": "steps",
    "n_samples": "samples",
    "n_masks": "samples",
    "n_ablations": "samples",
    "samples": "samples",
}
"""Method options that multiply a method's passes, and what they count."""

