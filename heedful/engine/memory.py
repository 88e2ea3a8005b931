"""Memory: the budget a pass may use, and an estimate of what one pass over a chunk of rows
takes, from the model's shape, so that every planner cuts its chunks under the budget.

The budget (``max_memory``, bytes) lives on the adapter: :func:`parse_memory` reads ``"4GB"``,
``"512MiB"`` or a number of bytes; :func:`default_budget` is half of the memory available when
the model is loaded. It bounds what one pass takes *on top of* what the process already holds
(the weights, the batch, the results kept so far).

:func:`estimate` is the peak of one pass over ``rows`` rows of ``width`` (``N``) positions,
from the model's :class:`ModelShape` (``L`` blocks of width ``D``, ``H`` heads, ``H_kv``
key/value heads of ``d``, MLP width ``F``) and what the pass keeps and how it runs
(:class:`Need`). Its terms, per row, ``e`` bytes per value:

* one block's working set at a time: ``e x N x`` (:data:`FORWARD_D` ``D`` +
  :data:`FORWARD_F` ``F``). Eager attention adds the scores and probabilities ``[H, Q, N]``
  (``Q`` query positions): :data:`ATTENTION_COPIES` of them alive at once -- the product, the
  scaled and masked scores and the softmax are each a new tensor whose input is freed after
  it, and the probabilities stay referenced through the MLP -- at 4 bytes (softmax runs in
  float32), and the additive mask ``[Q, N]``. Fused attention
  (PyTorch's ``scaled_dot_product_attention``, which the adapter runs wherever no
  probabilities are asked for) materialises no scores, only a padded batch's mask (boolean,
  and its float copy inside the kernel);
* the outputs read at the anchors, ``K x C`` twice (:meth:`ModelAdapter.forward
  <heedful.adapters.ModelAdapter.forward>` applies the head -- for an LM the whole vocabulary
  -- at the anchors only);
* kept hidden states ``(L + 1) x N x D``; kept attention probabilities ``L x H x N x N`` (a
  4,096-token rollout of smollm2-135m keeps 18 GB: it cannot fit a 4 GB budget and is
  refused);
* a backward with saved activations: every block keeps ``e x N x`` (:data:`SAVED_D` ``D`` +
  :data:`SAVED_F` ``F``), its probabilities with eager attention (:data:`SAVED_ATTENTION`) or
  its float mask with fused attention over padded rows (:data:`SAVED_MASK` bytes a cell), and
  one block's backward holds :data:`BACKWARD_COPIES` score-sized gradients (eager);
* a backward with per-block gradient checkpointing keeps every block's input ``N x D`` (and
  the gradient flowing back) and recomputes one block at a time: one block's saved activations
  plus the larger of its forward and backward working sets;
* a forward in position chunks of ``Q`` (chunked prefill, decoders) keeps the key/value cache
  ``2 x L x H_kv x d x N`` twice (it grows by concatenation) and the last hidden state, and
  holds ``[H, Q, N]`` scores per block instead of ``[H, N, N]`` (with fused attention the
  cache costs about what the chunks save, and :func:`fit` picks it only where its estimate is
  the lower);
* ``extra_per_row``: what the caller keeps beside the pass (e.g. a reused key/value prefix,
  :meth:`ModelShape.cache_bytes`).

The sum is multiplied by :data:`MARGIN` and :data:`FIXED` is added per pass. :func:`fit`
turns the estimate into rows per pass, and falls back to checkpointing or chunked prefill
(or refuses) where one row does not fit.

A pass with gradients keeps one tensor per block for later (its saved activations, or its
input when checkpointed); between them the heap holds holes that the next block's larger
temporaries do not fit, and glibc's heap grows by about one block's working set per block.
The adapter gives the free pages back after each block's forward and backward
(:func:`release_heap`) in checkpointed and chunked-prefill passes and in passes with gradients
estimated above :data:`RELEASE_SHARE` of the budget (the pages are faulted in again: about 10%
of a short pass's time); on smollm2-135m this took a checkpointed 2,048-token backward from
+776 MiB to +303 MiB and a plain one from +1,135 MiB to +913 MiB.

Calibration (``benchmarks/memory_calibration.py``, whose output ``docs/design.md``
summarises): each kind of pass run as the runner runs it, one thread, after a warm-up pass,
its peak taken as ``VmHWM`` (reset through ``/proc/self/clear_refs`` after the freed heap is
returned) minus ``VmRSS`` before it: on smollm2-135m at 512..4,096 positions and on tiny
Llama, GPT-2 and BERT models widened to D 128, 8 heads, 4 blocks, at 1,024 positions.
Autograd's saved tensors were also counted exactly (``saved_tensors_hooks``): a Llama block
with fused attention saves ``4.7 D + 3 F`` values per position (norm inputs, q, k, v, the
attention output, the MLP's activations), and eager attention adds the ``H x N x N``
probabilities once. The constants are the per-block counts of the measured peaks rounded up
over all families (GPT-2's tanh GELU saves the most ``F``-sized tensors), so that every
measured peak is at or below its estimate; the estimates are 1.1-2x the measured peaks on
smollm2-135m and up to 3x on the tiny models (whose peaks are a few tens of MiB).
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from heedful.errors import InputError

__all__ = [
    "FORWARD",
    "Fit",
    "ModelShape",
    "Need",
    "current_rss",
    "default_budget",
    "estimate",
    "fit",
    "format_bytes",
    "kept_bytes",
    "near_budget",
    "parse_memory",
    "peak_rss",
    "peak_rss_mb",
    "refusal",
    "release_heap",
    "require",
    "reset_peak_rss",
    "rows_within",
    "together",
]

Grad = Literal["none", "saved", "checkpoint"]
"""What a pass does after its forward: nothing (``torch.no_grad``), a backward through saved
activations, or a backward with per-block gradient checkpointing."""

SCORE_BYTES = 4
"""Bytes per attention score (softmax runs in float32 whatever the model's dtype)."""
ATTENTION_COPIES = 2.5
"""Score-sized ``[H, Q, N]`` tensors alive at once in an eager attention forward: each of the
product, the scaled and the masked scores and the softmax is a new tensor whose input is freed
after it (two alive), and the block's probabilities stay referenced until its MLP has run;
measured peaks on smollm2-135m reached 2.4 copies' worth."""
FORWARD_D = 8.0
"""``D``-sized values per position alive in a block's forward (residual, norm, q/k/v,
rotated and repeated k/v, context, output)."""
FORWARD_F = 8.0
"""``F``-sized values per position alive in a block's forward (gate, up, activation, their
product, the allocator's rounding)."""
SAVED_ATTENTION = 1.0
"""Score-sized tensors a block with eager attention saves for its backward (the
probabilities; the product and the masked scores are not saved)."""
SAVED_MASK = 10.0
"""Bytes per ``N x N`` cell a block with fused attention saves for its backward when its rows
are padded (the boolean mask turned into an additive float mask per block)."""
SAVED_D = 6.0
"""``D``-sized values per position a block saves for its backward (norm inputs, q, k, v, the
attention output), allocator slack included."""
SAVED_F = 4.0
"""``F``-sized values per position a block saves for its backward (the MLP's activations)."""
BACKWARD_COPIES = 3.0
"""Score-sized gradients alive at once in the backward of a block with eager attention."""
MARGIN = 1.15
"""Safety factor on the sum (allocator rounding, fragmentation)."""
FIXED = 16 * 2**20
"""Bytes added to every pass (per-call buffers, Python objects)."""
RELEASE_SHARE = 0.5
"""A pass with gradients estimated above this share of the budget gives the heap's free pages
back after each block (:func:`release_heap`, :func:`near_budget`); below it, the heap's growth
(measured up to 1.3x the live tensors) still leaves the pass under the budget, and the pages
need not be faulted in again."""
MIN_BUDGET = 256 * 2**20
"""Least default budget: below it the default is this (a smaller one can still be given)."""

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory(value: str | int) -> int:
    """Bytes of a memory size: an int (bytes) or a string ``"4GB"``, ``"4 GiB"``, ``"512MiB"``,
    ``"1.5G"``, ``"2048"``. ``KB``/``MB``/``GB``/``TB`` are powers of 1000, ``KiB``/``MiB``/
    ``GiB``/``TiB`` and the bare letters ``K``/``M``/``G``/``T`` powers of 1024 (case does not
    matter). Anything else, and sizes below one byte, are a one-line :class:`InputError`."""
    hint = 'give a size like "4GB", "512MiB" or a number of bytes'
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"max_memory must be a size like '4GB' or a number of bytes, got {value!r}", hint=hint)
    if isinstance(value, int):
        if value < 1:
            raise InputError(f"max_memory must be positive, got {value} bytes", hint=hint)
        return value
    found = _MEMORY.match(value)
    unit = found.group(2).lower() if found else ""
    if not found or unit not in _UNITS:
        raise InputError(f"cannot read {value!r} as a memory size", hint=hint)
    size = int(float(found.group(1)) * _UNITS[unit])
    if size < 1:
        raise InputError(f"max_memory must be positive, got {value!r}", hint=hint)
    return size


def format_bytes(size: float) -> str:
    """``size`` bytes as ``"4.0 GiB"`` / ``"512 MiB"`` (powers of 1024)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}" if size < 10 * scale else f"{size / scale:.0f} {unit}"
    return f"{int(size)} B"


def available_memory() -> int | None:
    """Bytes of memory available to new work: ``MemAvailable`` of ``/proc/meminfo`` (Linux),
    else the free physical pages (``os.sysconf``), else ``None``."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget() -> int:
    """The default ``max_memory``: half of the memory available now (``MemAvailable`` on Linux,
    the free physical pages elsewhere -- :func:`available_memory`), so that the other half stays
    for the results, the rest of the process and other processes; at least
    :data:`MIN_BUDGET`; 4 GiB where the available memory cannot be read."""
    free = available_memory()
    if free is None:
        return 4 * 2**30
    return max(MIN_BUDGET, free // 2)


# ---------------------------------------------------------------------------- the estimator
@dataclass(frozen=True)
class ModelShape:
    """What the memory of a pass depends on: ``layers`` blocks of width ``hidden`` (``D``),
    ``heads`` query heads (``H``) and ``kv_heads`` key/value heads of ``head_dim`` (``d``),
    MLP width ``intermediate`` (``F``), ``outputs`` columns of the head read at the anchors
    (classes, or the vocabulary of an LM head), word embeddings of ``embed`` dimensions,
    ``element`` bytes per value (4 for float32), whether the model is a ``decoder`` (which has
    a key/value cache) and whether its passes without attention probabilities run ``fused``
    attention (PyTorch's ``scaled_dot_product_attention``: no ``[H, N, N]`` tensor)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    outputs: int
    embed: int
    element: int = 4
    decoder: bool = False
    fused: bool = False

    def cache_bytes(self, width: int) -> int:
        """Bytes of one row's key/value cache over ``width`` positions:
        ``2 x L x H_kv x d x width x element``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * width * self.element


@dataclass(frozen=True)
class Need:
    """What a pass keeps and how it runs: ``grad`` (see :data:`Grad`); all ``hidden_states``
    ``(L + 1) x [N, D]``; all ``attentions`` ``L x [H, N, N]`` (eager attention); ``eager``:
    attention runs eager even without them (inside an interception, whose rules see the
    model as built); ``anchors``: positions per row where the head is read (``K``, a span's
    length); ``queries``: positions per forward chunk (chunked prefill; ``None``: all at once);
    ``padded``: rows may be padded (a mask per block; a row alone in its pass is not);
    ``extra_per_row``: bytes the caller keeps per row beside the pass."""

    grad: Grad = "none"
    hidden_states: bool = False
    attentions: bool = False
    eager: bool = False
    anchors: int = 1
    queries: int | None = None
    padded: bool = True
    extra_per_row: int = 0

    def describe(self, width: int) -> str:
        """``"a forward pass over 4096 positions keeping all attention probabilities"``: what
        the pass is, for messages."""
        kind = {
            "none": "a forward pass",
            "saved": "a forward and backward pass",
            "checkpoint": "a checkpointed forward and backward pass",
        }[self.grad]
        kept = [w for w, on in (("hidden states", self.hidden_states), ("attention probabilities", self.attentions)) if on]
        keeping = f" keeping all {' and '.join(kept)}" if kept else ""
        chunked = f" in chunks of {self.queries} positions" if self.queries else ""
        return f"{kind} over {width} positions{keeping}{chunked}"


FORWARD = Need()
"""A forward pass without gradient that keeps nothing but the outputs at the anchors."""


def estimate(shape: ModelShape, rows: int, width: int, need: Need = FORWARD) -> int:
    """Estimated peak bytes of one pass over ``rows`` rows of ``width`` positions that keeps
    ``need`` (see the module docstring for the terms and their calibration)."""
    if rows <= 0:
        return 0
    return int(FIXED + rows * _per_row(shape, width, need))


def _per_row(shape: ModelShape, width: int, need: Need) -> float:
    """Estimated bytes of one row of a pass (the terms of the module docstring)."""
    e, s = shape.element, SCORE_BYTES
    n = width
    q = min(need.queries or n, n)
    L, D, H, F = shape.layers, shape.hidden, shape.heads, shape.intermediate
    eager = need.attentions or need.eager or not shape.fused
    if eager:  # the scores / probabilities [H, Q, N] and the additive mask [Q, N]
        attention = ATTENTION_COPIES * s * H * q * n + e * q * n
    else:  # a padded batch's boolean mask and its float copy inside the fused kernel
        attention = (1 + s) * q * n if need.padded else 0.0
    block_forward = attention + e * q * (FORWARD_D * D + FORWARD_F * F)
    outputs = 2 * e * need.anchors * shape.outputs  # the logits at the anchors and their softmax
    kept = kept_bytes(shape, 1, n, need)
    if q < n:  # chunked prefill: the cache (twice: it grows by concatenation), the last hidden state
        kept += 2 * shape.cache_bytes(n) + e * n * D
    if need.grad == "none":
        work = block_forward
    else:
        if eager:
            block_saved = SAVED_ATTENTION * s * H * n * n
            block_backward = BACKWARD_COPIES * s * H * n * n + e * n * n
        else:
            block_saved = SAVED_MASK * n * n if need.padded else 0.0
            block_backward = (1 + s) * n * n if need.padded else 0.0
        block_saved += e * n * (SAVED_D * D + SAVED_F * F)
        block_backward += e * n * (FORWARD_D * D + FORWARD_F * F)
        embeds = 2 * e * n * shape.embed  # the input embeddings and their gradient
        if need.grad == "saved":
            work = L * block_saved + block_backward + embeds
        else:  # every block's input kept (and two gradients); one block recomputed at a time
            work = e * (L + 2) * n * D + block_saved + max(block_forward, block_backward) + embeds
    return MARGIN * (work + kept + outputs) + need.extra_per_row


def kept_bytes(shape: ModelShape, rows: int, width: int, need: Need = FORWARD) -> int:
    """Bytes of what a pass over ``rows`` rows of ``width`` positions returns besides its
    logits: all hidden states ``(L + 1) x N x D`` (``element`` bytes each) and all attention
    probabilities ``L x H x N x N`` (4 bytes each), when ``need`` keeps them."""
    kept = 0
    if need.hidden_states:
        kept += shape.element * (shape.layers + 1) * width * shape.hidden
    if need.attentions:
        kept += SCORE_BYTES * shape.layers * shape.heads * width * width
    return rows * kept


def near_budget(needed: int, budget: int) -> bool:
    """Whether a pass estimated at ``needed`` bytes should give the heap's free pages back after
    each block (above :data:`RELEASE_SHARE` of ``budget``)."""
    return needed > RELEASE_SHARE * budget


def rows_within(shape: ModelShape, width: int, budget: int, need: Need = FORWARD) -> int:
    """Most rows of ``width`` positions one pass keeping ``need`` may hold within ``budget``
    bytes (0: not even one)."""
    return max(0, int((budget - FIXED) // _per_row(shape, width, need)))


@dataclass(frozen=True)
class Fit:
    """How rows of one width run under a budget: at most ``rows`` per pass, each pass keeping
    ``need`` (the asked-for need, or it with gradient checkpointing, chunked prefill or one
    unpadded row per pass)."""

    rows: int
    need: Need


def fit(
    shape: ModelShape,
    width: int,
    budget: int,
    need: Need = FORWARD,
    *,
    checkpoint: bool = True,
    prefill: bool = True,
    group: int = 1,
) -> Fit:
    """How passes over rows of ``width`` positions that keep ``need`` fit in ``budget`` bytes,
    trying in turn:

    1. as many rows as fit (at least ``group``, rows that must run together);
    2. one row alone (``group`` 1), which is never padded;
    3. with ``checkpoint``, a backward with saved activations as a backward with per-block
       gradient checkpointing;
    4. with ``prefill``, a decoder's forward without gradient or attention probabilities in
       position chunks with its key/value cache (the longest chunk that fits; one row a pass).

    When none fits, an :class:`InputError` naming what the pass needs, the budget and the fix
    (raised by the planning, before any work)."""
    tries = [(need, False)]  # (need, one row alone)
    if group == 1 and need.padded:
        tries.append((replace(need, padded=False), True))
    if need.grad == "saved" and checkpoint:
        tries += [(replace(t, grad="checkpoint"), alone) for t, alone in tries]
    for attempt, alone in tries:
        rows = rows_within(shape, width, budget, attempt)
        if rows >= group:
            return Fit(1 if alone else rows, attempt)
    if need.grad == "none" and prefill and shape.decoder and not need.attentions and group == 1 and width > 1:
        alone = replace(need, padded=False)
        lo, hi = 0, width - 1  # the longest chunk of positions short of the whole width that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if rows_within(shape, width, budget, replace(alone, queries=mid)) >= 1:
                lo = mid
            else:
                hi = mid - 1
        if lo >= 1:
            return Fit(1, replace(alone, queries=lo))
    raise refusal(shape, width, budget, need if group > 1 else replace(need, padded=False), group)


def together(shape: ModelShape, parts: Iterable[tuple[int, int]], need: Need = FORWARD) -> int:
    """Estimated bytes of passes over ``parts`` -- ``(rows, width)`` pairs -- all alive at once
    (e.g. length chunks whose autograd graphs are all kept for one backward): the sum of their
    estimates, a part of one row unpadded."""
    return sum(estimate(shape, rows, width, replace(need, padded=need.padded and rows > 1)) for rows, width in parts)


def require(shape: ModelShape, budget: int, parts: Iterable[tuple[int, int]], need: Need = FORWARD) -> None:
    """An :class:`InputError` (:func:`refusal`) when the passes over ``parts`` -- ``(rows,
    width)`` pairs, all alive at once -- need more than ``budget`` bytes (:func:`together`)."""
    parts = list(parts)
    needed = together(shape, parts, need)
    if needed > budget:
        rows, width = sum(r for r, _ in parts), max((w for _, w in parts), default=0)
        raise refusal(shape, width, budget, need, rows, needed)


def refusal(shape: ModelShape, width: int, budget: int, need: Need, rows: int = 1, needed: int | None = None) -> InputError:
    """The one-line :class:`InputError` for ``rows`` rows of a pass over ``width`` positions
    that cannot fit ``budget`` (``needed``: its estimate, default :func:`estimate`'s)."""
    needed = estimate(shape, rows, width, need) if needed is None else needed
    what = need.describe(width) if rows == 1 else f"{rows} rows of {need.describe(width)}"
    fixes = ["raise max_memory (--max-memory)", "shorten the input"]
    if need.attentions:
        fixes.append("or use a method that keeps no attention probabilities (e.g. saliency)")
    elif need.grad != "none":
        fixes.append("or use a forward-only method")
    return InputError(
        f"{what} needs about {format_bytes(needed)} of memory; the budget is {format_bytes(budget)}",
        hint=", ".join(fixes),
    )


# ---------------------------------------------------------------------------- measuring
def release_heap() -> None:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere).
    A pass that keeps one tensor per block (a checkpointed pass keeps every block's input)
    leaves holes between them that later, larger temporaries do not fit, and the heap grows by
    the block's working set per block; trimming after each block keeps resident memory to the
    tensors alive."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018  (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def reset_peak_rss() -> bool:
    """Give freed heap memory back to the system (so an earlier pass's freed buffers do not
    count) and reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``); False
    where the mark cannot be reset."""
    gc.collect()
    release_heap()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss() -> int:
    """Resident memory of this process now, in bytes (Linux ``VmRSS``; else the peak)."""
    found = _status("VmRSS:")
    return found if found is not None else peak_rss()


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (since the last :func:`reset_peak_rss`
    where supported)."""
    found = _status("VmHWM:")
    if found is not None:
        return found
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (since the last reset where supported)."""
    return peak_rss() / 2**20
