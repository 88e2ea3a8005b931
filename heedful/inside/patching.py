"""Activation patching, batched: every restoration of one grid in as few passes as memory allows.

A run on a *corrupted* input (noised word embeddings, or a second prompt of the same length) is
repeated once per *cell*; each cell restores a set of sites of one role to the values they take
in the run on the *clean* input, and the head's output at the anchor is read (Meng et al. 2022,
"Locating and Editing Factual Associations in GPT", Sec. 2.1: the corrupted-with-restoration
run). A cell is a boolean mask ``restore [L, N, G]`` over layers, positions and groups (``G = 1``:
the whole vector of the role at that position; ``G = H``: one attention head's slice of the
``context`` role). The copies of all cells -- ``C`` cells times ``S`` corrupted samples -- are
rows of a few batched passes, as many rows per pass as the adapter's memory budget allows
(:meth:`heedful.adapters.ModelAdapter.fit`); at each layer one ``torch.where`` writes the clean
values into the rows whose cell restores there.

In a causal model the positions before the first one the corruption changes are computed
identically in the clean run and in every corrupted row, restored or not: the passes continue
the clean prompt's key/value cache there (:meth:`heedful.adapters.ModelAdapter.prefix_states`,
as :mod:`heedful.engine.reuse` does for removals) and compute only the positions from the first
changed one on -- "The capital of France is" against "... Italy is" runs 2 of its 5 positions.

The roles (:mod:`heedful.adapters.roles`) name where the tensors pass, so this works on every
family with roles:

==========  =========  ===========================================================
kind        role       tensor restored
==========  =========  ===========================================================
residual    block_out  the residual stream leaving block ``l`` (``hidden_states[l+1]``)
attn        attn_out   the attention sub-layer's output projection
mlp         mlp_out    the MLP's output projection
head        context    one head's slice ``[d]`` of the merged heads entering ``attn_out``
==========  =========  ===========================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from heedful.adapters import ModelAdapter, PrefixStates
from heedful.engine.batch import Batch
from heedful.engine.memory import Need
from heedful.errors import InputError, UnsupportedModelError
from heedful.progress import task

MIN_ROWS = 128
"""Rows of a pass that already use the matrix kernels well on a CPU; a grid larger than
``MIN_ROWS * STEPS`` rows runs in about ``STEPS`` passes (where memory allows), so that its
progress shows and Ctrl-C keeps most of it."""
STEPS = 20

KINDS: dict[str, str] = {"residual": "block_out", "attn": "attn_out", "mlp": "mlp_out", "head": "context"}
"""What a grid restores -> the role it is restored at."""

METRICS: tuple[str, ...] = ("prob", "logprob", "logit", "logit_diff")
"""What is read at the anchor: the target's probability (ROME's), its log-probability, its logit,
or its logit minus a contrast token's (``logit_diff``, the usual metric of prompt pairs)."""


def role_of(kind: str) -> str:
    """The role a grid of ``kind`` restores (see :data:`KINDS`); one-line error otherwise."""
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}", hint=f"one of {', '.join(KINDS)}")
    return KINDS[kind]


def require_roles(adapter: ModelAdapter, kind: str) -> int:
    """The number of heads of a ``head`` grid (1 for the other kinds), after checking that the
    model's family maps the roles (a one-line :class:`UnsupportedModelError` otherwise)."""
    roles = adapter.roles()  # a family without roles refuses here, in one line
    site = roles.blocks[0].site(role_of(kind))
    if kind != "head":
        return 1
    if site.heads is None:
        raise UnsupportedModelError(f"{adapter.described} does not split its attention context into heads", hint="trace kind='attn' instead")
    return site.heads


@dataclass(frozen=True)
class Readout:
    """What one row's pass is scored by: ``metric`` (one of :data:`METRICS`) of output column
    ``target`` at the anchor (``contrast``: the column subtracted for ``logit_diff``)."""

    metric: str
    target: int
    contrast: int | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``[R, C]`` logits at the anchor -> ``[R]`` scores (in float32 at least)."""
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if self.metric == "prob":
            return logits.softmax(-1)[:, self.target]
        if self.metric == "logprob":
            return logits.log_softmax(-1)[:, self.target]
        if self.metric == "logit":
            return logits[:, self.target]
        return logits[:, self.target] - logits[:, self.contrast]


@dataclass(frozen=True)
class Runs:
    """One prompt's clean and corrupted inputs: ``batch`` (one example of ``N`` positions),
    ``anchor`` ``[1]``, ``clean`` word embeddings ``[1, N, E]``, ``corrupted`` ``[S, N, E]`` (``S``
    noise samples, or one corrupted prompt), ``readout`` the score of a pass; ``prefix``: the
    clean prompt's key/value cache over its first ``p`` positions and ``p``, which passes over
    corrupted rows continue (:func:`with_shared_prefix`; ``None``: full passes)."""

    batch: Batch
    anchor: torch.Tensor
    clean: torch.Tensor
    corrupted: torch.Tensor
    readout: Readout
    prefix: tuple[PrefixStates, int] | None = None

    @property
    def samples(self) -> int:
        return self.corrupted.shape[0]

    @property
    def width(self) -> int:
        return self.clean.shape[1]


def forward_rows(adapter: ModelAdapter, runs: Runs, embeds: torch.Tensor) -> torch.Tensor:
    """Logits ``[R, C]`` at the anchor for rows of input embeddings ``[R, N, E]`` (with
    ``runs.prefix``: the rows continue the clean cache, and only their positions from ``p`` on
    are computed -- the sites the interception sees are ``[R, N - p, ...]``)."""
    rows = embeds.shape[0]
    mask = runs.batch.attention_mask.to(embeds.device).expand(rows, -1)
    if runs.prefix is None:
        return adapter.forward(runs.batch, runs.anchor.expand(rows), inputs_embeds=embeds, attention_mask=mask).logits
    states, shared = runs.prefix
    continued = (states, torch.zeros(rows, dtype=torch.long, device=embeds.device), shared)
    anchor = (runs.anchor - shared).expand(rows)
    return adapter.forward(runs.batch, anchor, inputs_embeds=embeds[:, shared:], attention_mask=mask, prefix=continued).logits


def shared_positions(adapter: ModelAdapter, runs: Runs) -> int:
    """How many leading positions every corrupted row has exactly as the clean input -- which a
    causal model computes identically in all runs -- up to the anchor's (0 for a model without a
    key/value cache)."""
    if not adapter.is_decoder:
        return 0
    same = (runs.corrupted == runs.clean).all(dim=0).all(dim=-1)  # [N]
    return min(int(same.long().cumprod(0).sum()), int(runs.anchor.min()))


def with_shared_prefix(adapter: ModelAdapter, runs: Runs) -> Runs:
    """``runs`` whose passes over corrupted rows continue the clean prompt's cache over the
    :func:`shared_positions` (unchanged when there are none)."""
    shared = shared_positions(adapter, runs)
    if shared == 0:
        return runs
    batch = runs.batch
    states = adapter.prefix_states(batch.with_ids(batch.input_ids[:, :shared], batch.attention_mask[:, :shared]))
    return replace(runs, prefix=(states, shared))


def recorded(adapter: ModelAdapter, runs: Runs, embeds: torch.Tensor, kind: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One pass over ``embeds`` ``[R, N, E]`` keeping ``kind``'s role at every layer: the values
    ``[R, N, D]`` (heads merged, ``[R, N, H*d]``; in the autograd graph when gradients are
    enabled, so not split: a split view is no part of the graph) and the scores ``[R]``."""
    with adapter.intercept() as hooks:
        found = hooks.record(role_of(kind))
        scores = runs.readout(forward_rows(adapter, runs, embeds))
    return [found[layer] for layer in sorted(found)], scores


def grouped(value: torch.Tensor, groups: int) -> torch.Tensor:
    """``[..., D]`` as ``[..., G, D / G]`` for ``G > 1`` groups (heads), unchanged for one."""
    return value if groups == 1 else value.unflatten(-1, (groups, -1))


def rows_per_pass(adapter: ModelAdapter, width: int, grad: bool = False) -> int:
    """Rows of ``width`` positions one pass may hold within the adapter's memory budget (a row
    alone when even two do not fit; a one-line :class:`InputError` when one does not)."""
    need = Need(grad="saved" if grad else "none", padded=False)
    return adapter.fit(width, need, checkpoint=False, prefill=False).rows


def _restore(mask: torch.Tensor, clean: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` ``[R, N, D]`` (per head ``[R, N, H, d]``) with the clean values ``[1, N, ...]``
    where ``mask`` ``[R, N, G]`` says so."""
    keep = mask if value.dim() == 3 else mask[..., None]
    return torch.where(keep, clean.to(value.dtype), value)


@dataclass
class Patched:
    """The scores of the corrupted runs with each cell restored: ``scores`` ``[C]`` (the mean over
    the ``S`` samples; NaN where not computed), ``done`` ``[C]`` which cells were, ``passes``
    the passes run (the shared prefix's and the batched rows'), ``interrupted`` whether Ctrl-C stopped the work."""

    scores: torch.Tensor
    done: torch.Tensor
    passes: int
    interrupted: bool = False


def patch(
    adapter: ModelAdapter,
    runs: Runs,
    kind: str,
    clean_states: list[torch.Tensor],
    restore: torch.Tensor,
    *,
    rows: int | None = None,
    description: str = "patching",
) -> Patched:
    """Score the corrupted runs with each cell of ``restore`` ``[C, L, N, G]`` restored to
    ``clean_states`` (per layer ``[1, N, D]``, :func:`recorded` on the clean input).

    Rows ``c * S + s`` (cell ``c``, sample ``s``) run ``rows`` at a time (default: as many as the
    memory budget allows, :func:`rows_per_pass`); the cells are scored in order, so a
    ``KeyboardInterrupt`` keeps every cell whose samples all ran (``interrupted``, ``done``)."""
    cells, samples = restore.shape[0], runs.samples
    runs = with_shared_prefix(adapter, runs)
    shared = 0 if runs.prefix is None else runs.prefix[1]
    total = cells * samples
    rows = rows or min(rows_per_pass(adapter, runs.width), max(MIN_ROWS, -(-total // STEPS)))
    device = runs.corrupted.device
    restore = restore.to(device)
    per_row = torch.full((total,), float("nan"))
    passes, interrupted = int(shared > 0), False  # the prefix's pass
    starts = range(0, total, rows)
    with torch.no_grad(), task(description, len(starts), shown=len(starts) > 1) as progress:
        try:
            for start in starts:
                index = torch.arange(start, min(start + rows, total), device=device)
                chunk = restore[index // samples, :, shared:]  # [R, L, N - p, G]: the positions computed
                with adapter.intercept() as hooks:
                    for layer in chunk.any(dim=(0, 2, 3)).nonzero().flatten().tolist():
                        clean = grouped(clean_states[layer][:, shared:], restore.shape[-1])
                        rule: Callable = partial(_restore, chunk[:, layer], clean)
                        hooks.replace(role_of(kind), rule, layers=[layer], per_head=kind == "head")
                    scores = runs.readout(forward_rows(adapter, runs, runs.corrupted[index % samples]))
                per_row[start : start + len(index)] = scores.cpu()
                passes += 1
                progress.advance()
        except KeyboardInterrupt:
            interrupted = True
    grid = per_row.view(cells, samples)
    done = ~grid.isnan().any(dim=1)
    return Patched(grid.mean(dim=1), done, passes, interrupted)


UNCHANGED = 1e-5
"""A site whose clean and corrupted values differ by at most this share of the layer's largest
clean magnitude is unchanged by the corruption (float32 rounding of passes of other batch
shapes differs by ~1e-7)."""


def unchanged_sites(clean_states: list[torch.Tensor], corrupted_states: list[torch.Tensor], groups: int) -> torch.Tensor:
    """``[L, N, G]``: which sites the corruption left as they were in every sample (``clean``
    per layer ``[1, N, D]``, ``corrupted`` ``[S, N, D]``) -- in a causal model, every position
    before the first corrupted token. Restoring them changes nothing, so their cells need no
    pass."""
    found = []
    for clean, corrupted in zip(clean_states, corrupted_states, strict=True):
        gap = grouped((corrupted - clean).abs(), groups).amax(dim=(0, -1))  # [N] or [N, H]
        found.append(gap <= UNCHANGED * float(clean.abs().max()))
    stacked = torch.stack(found)
    return stacked if groups > 1 else stacked[..., None]


def restore_cells(layers: int, width: int, groups: int, kind: str, window: int = 1) -> torch.Tensor:
    """The cells of a grid, layer-major: ``[C, L, N, G]`` booleans.

    ``residual`` / ``attn`` / ``mlp``: cell ``(l, p)`` restores position ``p`` at the ``window``
    layers centred on ``l`` (ROME restores single hidden states, and runs of 10 MLP or attention
    layers: ``window=10``), ``C = L * N``. ``head``: cell ``(l, h)`` restores head ``h`` of layer
    ``l`` at every position, ``C = L * H``."""
    if window < 1:
        raise InputError(f"window must be at least 1, got {window}", hint="window=1 restores one layer per cell")
    eye = torch.eye(layers, dtype=torch.bool)
    if window > 1:  # layers l - window // 2 ... l - window // 2 + window - 1, cut to the model
        index = torch.arange(layers)
        offset = index[None, :] - index[:, None] + window // 2
        eye = (offset >= 0) & (offset < window)
    if kind == "head":
        heads = torch.eye(groups, dtype=torch.bool)
        cells = eye[:, None, :, None, None] & heads[None, :, None, None, :]  # [L, H, L, 1, H]
        return cells.expand(layers, groups, layers, width, groups).reshape(layers * groups, layers, width, groups)
    positions = torch.eye(width, dtype=torch.bool)
    cells = eye[:, None, :, None] & positions[None, :, None, :]  # [L, N, L, N]
    return cells.reshape(layers * width, layers, width, 1)
