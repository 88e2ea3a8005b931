"""Problem: what to explain, prepared once -- the encoded batch, the resolved target with its
anchor positions, and the unperturbed reference pass.

Every method takes a :class:`Problem` and returns scores for every position of its batch; the
applications, the evaluation and the reproductions build theirs with :func:`prepare` (or
:meth:`heedful.Model.prepare`) and never rebuild the sequence encode -> anchor -> forward ->
resolve target themselves.

>>> import heedful
>>> model = heedful.load("minilm-sentiment")                                  # doctest: +SKIP
>>> problem = model.prepare(["great acting", "a dull plot"])                  # doctest: +SKIP
>>> problem.target.labels                                                      # doctest: +SKIP
['POSITIVE', 'NEGATIVE']
>>> heedful.get_method("saliency")(problem).shape                              # doctest: +SKIP
torch.Size([2, 5])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from heedful.adapters import Forward, ModelAdapter, PrefixStates
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import Fit, Need, estimate, kept_bytes, refusal
from heedful.engine.readable import marked
from heedful.engine.sequences import continue_batch, span_ids
from heedful.engine.sources import SourceMap, SourceSpec, Span, map_sources
from heedful.engine.targets import (
    GENERATIVE,
    QUANTITIES,
    Columns,
    ResolvedTarget,
    Target,
    resolve_target,
)
from heedful.errors import InputError

ReferencePass = Callable[[ModelAdapter, Batch, torch.Tensor, "torch.Tensor | None"], Forward]
"""``reference(adapter, batch, anchor, inputs_embeds) -> Forward``: a method's own reference
pass (see :class:`~heedful.registry.MethodInfo`)."""


@dataclass
class Problem:
    """A batch to explain, ready for any method.

    ``batch``: the encoded texts ``[B, N]``; ``target``: the resolved target (per-example anchor
    position ``[B]``, output columns ``[B, K]`` and weights ``[K]``); ``reference``: the
    unperturbed pass from which the target was resolved (``logits`` ``[B, C]`` at the anchors;
    hidden states and attention probabilities when they were asked for -- see
    :meth:`reference_with`); ``request``: the target as the user asked for it;
    ``inputs_embeds`` ``[B, N, E]``: word embeddings that replace the ids' own (a problem about
    edited inputs: noised, down-weighted), ``None`` for the ids' embeddings; ``sources``: the
    texts cut into sources (:mod:`heedful.engine.sources`) when asked for; ``details``: what a method
    reports besides scores, one list entry per example (a surrogate's fit quality, ...).
    """

    adapter: ModelAdapter
    batch: Batch
    target: ResolvedTarget
    reference: Forward
    request: Target | Columns
    inputs_embeds: torch.Tensor | None = None
    sources: SourceMap | None = None
    details: dict[str, list] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def anchor(self) -> torch.Tensor:
        """``[B]``: the position whose head output is explained, per example."""
        return self.target.anchor

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    def source_map(self) -> SourceMap:
        """The problem's sources; sentences when none were asked for (kept on the problem)."""
        if self.sources is None:
            ends = None
            if self.target.is_span:  # the texts were continued by the span, which is no source
                last = self.target.positions[:, 0].tolist()
                ends = [offs[i][1] if offs[i] else len(t) for offs, i, t in zip(self.batch.offsets, last, self.batch.texts, strict=True)]
            self.sources = map_sources(self.batch, None, ends)
        return self.sources

    def word_embeddings(self) -> torch.Tensor:
        """The word embeddings the problem starts from ``[B, N, E]`` (detached)."""
        if self.inputs_embeds is not None:
            return self.inputs_embeds.detach()
        return self.adapter.embed(self.batch.input_ids).detach()

    def forward(
        self,
        *,
        rows: torch.Tensor | None = None,
        width: int | None = None,
        inputs_embeds: torch.Tensor | None = None,
        hidden_states: bool = False,
        attentions: bool = False,
    ) -> Forward:
        """A pass over examples ``rows`` (default all) cut to the first ``width`` positions,
        from ``inputs_embeds`` ``[R, W, E]`` when given (else the problem's own start), read at
        the examples' anchors."""
        batch = self.batch
        rows = torch.arange(len(batch), device=batch.input_ids.device) if rows is None else rows
        inputs = batch.cut(rows, batch.seq_len if width is None else width)
        if inputs_embeds is None and self.inputs_embeds is not None:
            inputs_embeds = self.inputs_embeds[rows, : inputs["input_ids"].shape[1]]
        if inputs_embeds is not None:
            del inputs["input_ids"]
        return self.adapter.forward(
            batch,
            self.target.read_at[rows],
            **inputs,
            inputs_embeds=inputs_embeds,
            hidden_states=hidden_states,
            attentions=attentions,
        )

    def reference_with(self, *, hidden_states: bool = False, attentions: bool = False) -> Forward:
        """The reference pass with hidden states / attention probabilities; the pass runs once
        more (and the problem keeps the result) only when they were not asked for up front."""
        ref = self.reference
        missing_hidden = hidden_states and ref.hidden_states is None
        missing_attn = attentions and ref.attentions is None
        if missing_hidden or missing_attn:
            fwd = reference_pass(
                self.adapter,
                self.batch,
                self.anchor,
                self.inputs_embeds,
                hidden_states=hidden_states or ref.hidden_states is not None,
                attentions=attentions or ref.attentions is not None,
            )
            self.reference = replace(ref, hidden_states=fwd.hidden_states, attentions=fwd.attentions)
        return self.reference

    def select(self, rows: list[int] | torch.Tensor) -> Problem:
        """The problem restricted to examples ``rows`` (the batch trimmed to their longest)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.batch.input_ids.device)
        batch = self.batch.select(idx.tolist())
        width = batch.seq_len
        ref = self.reference
        cache = ref.cache
        reference = Forward(
            ref.logits[idx].detach(),
            None if ref.hidden_states is None else tuple(h[idx, :width].detach() for h in ref.hidden_states),
            None if ref.attentions is None else tuple(a[idx][..., :width, :width].detach() for a in ref.attentions),
            cache=None if cache is None else PrefixStates(
                tuple(k[idx.to(k.device), :, :width] for k in cache.keys), tuple(v[idx.to(v.device), :, :width] for v in cache.values)
            ),
            anchor_attention=None if ref.anchor_attention is None else ref.anchor_attention[idx.to(ref.anchor_attention.device), ..., :width],
        )
        embeds = None if self.inputs_embeds is None else self.inputs_embeds[idx, :width]
        sources = None if self.sources is None else self.sources.select(idx.tolist(), width)
        return replace(
            self, batch=batch, target=self.target.select(idx), reference=reference, inputs_embeds=embeds, sources=sources
        )

    def release_graph(self) -> Problem:
        """Drop the autograd graph a method's reference pass kept (a graph serves one backward;
        later methods run passes of their own). Returns the problem itself."""
        ref = self.reference
        if ref.inputs_embeds is not None or ref.logits.requires_grad:
            self.reference = replace(
                ref,
                logits=ref.logits.detach(),
                hidden_states=None if ref.hidden_states is None else tuple(h.detach() for h in ref.hidden_states),
                attentions=None if ref.attentions is None else tuple(a.detach() for a in ref.attentions),
                inputs_embeds=None,
                head_input=None,
            )
        return self


@torch.no_grad()
def reference_pass(
    adapter: ModelAdapter,
    batch: Batch,
    anchor: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
    *,
    hidden_states: bool = False,
    attentions: bool = False,
) -> Forward:
    """The unperturbed pass of every example (no gradient), in chunks of similar length
    (:func:`~heedful.engine.chunks.length_chunks`) whose estimated peak memory fits the adapter's
    ``max_memory`` (:mod:`heedful.engine.memory`), laid back out like ``batch``: ``logits`` ``[B, C]``
    at the anchors (``[B, K, C]`` at ``K`` positions per example); ``hidden_states`` ``L + 1`` x
    ``[B, N, D]`` and ``attentions`` ``L`` x ``[B, H, N, N]`` when asked for, 0 beyond each
    example's own positions (what a padded position would hold is no example's business). A
    row too long for one pass runs in position chunks with a decoder's key/value cache (chunked
    prefill); a pass that cannot fit at all -- e.g. all attention probabilities of a long input
    -- is an :class:`InputError` before any work, and so are hidden states or attention
    probabilities that do not fit laid out for the whole batch. A batch that is one chunk runs
    as it is."""
    need = Need(
        hidden_states=hidden_states,
        attentions=attentions,
        anchors=int(anchor.shape[1]) if anchor.dim() == 2 else 1,
        padded=bool(batch.lengths.min() != batch.lengths.max()),  # right padding only: rows of one length have none
    )
    fits: dict[int, Fit] = {}

    def planned(budget: int) -> list[tuple[torch.Tensor, int]]:
        def max_rows(width: int) -> int:
            fits[width] = adapter.fit(width, need, budget=budget)
            return fits[width].rows

        return length_chunks(batch.lengths, max_rows=max_rows)

    chunks = planned(adapter.max_memory)
    if len(chunks) > 1 and (hidden_states or attentions):
        # what the chunks return is laid out for the whole batch, beside each chunk's own pass
        shape = adapter.shape
        laid_out = kept_bytes(shape, len(batch), batch.seq_len, need)
        try:
            fits.clear()
            chunks = planned(adapter.max_memory - laid_out)
        except InputError:
            needed = laid_out + estimate(shape, 1, batch.seq_len, replace(need, padded=False))
            raise refusal(shape, batch.seq_len, adapter.max_memory, need, len(batch), needed) from None
    if len(chunks) == 1 and chunks[0][1] == batch.seq_len:
        return adapter.forward(
            batch,
            anchor,
            inputs_embeds=inputs_embeds,
            hidden_states=hidden_states,
            attentions=attentions,
            prefill=fits[batch.seq_len].need.queries,
        )
    logits: torch.Tensor | None = None
    hidden: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    bsz, seq = len(batch), batch.seq_len
    for rows, width in chunks:
        inputs = batch.cut(rows, width)
        if inputs_embeds is not None:
            inputs["inputs_embeds"] = inputs_embeds[rows, :width]
            del inputs["input_ids"]
        fwd = adapter.forward(
            batch, anchor[rows], **inputs, hidden_states=hidden_states, attentions=attentions, prefill=fits[width].need.queries
        )
        if logits is None:
            logits = fwd.logits.new_zeros(bsz, *fwd.logits.shape[1:])
            hidden = [h.new_zeros(bsz, seq, h.shape[-1]) for h in fwd.hidden_states or ()]
            probs = [a.new_zeros(bsz, a.shape[1], seq, seq) for a in fwd.attentions or ()]
        logits[rows] = fwd.logits
        for full, part in zip(hidden, fwd.hidden_states or (), strict=True):
            full[rows, :width] = part
        for full, part in zip(probs, fwd.attentions or (), strict=True):
            full[rows, :, :width, :width] = part
    return Forward(logits, tuple(hidden) if hidden_states else None, tuple(probs) if attentions else None)


def prepare(
    adapter: ModelAdapter,
    batch: Batch,
    target: Target | Columns | int | str | tuple | None = None,
    *,
    inputs_embeds: torch.Tensor | None = None,
    hidden_states: bool = False,
    attentions: bool = False,
    reference: ReferencePass | None = None,
    quantity: str | None = None,
    sources: SourceSpec | str | Sequence[Span] | None = None,
) -> Problem:
    """A :class:`Problem` for an encoded ``batch``: anchor positions, one reference pass
    (:func:`reference_pass`: no gradient, rows of similar length together, with hidden states /
    attentions when asked for; or ``reference``'s own pass), and the target resolved against its
    logits.

    ``target``: ``None`` (the predicted class / next token), a class index or label, a token
    string for language models, ``"A vs B"`` or ``(A, B)`` for a contrast; or
    :class:`~heedful.engine.targets.Columns`, explicit columns per example. A language-model target
    of several tokens (``" Paris is the capital"``) is a **span**: the texts are continued by
    its tokens and the score is their summed log-probability ``sum_k log p(y_k | x, y_<k)``,
    read at ``K`` positions of one pass. ``quantity``: ``"logit"`` (default for one position)
    or ``"log_prob"`` (default for a span). ``inputs_embeds`` ``[B, N, E]``: start from these
    word embeddings instead of the ids'. ``sources``: cut the texts into sources
    (:class:`~heedful.engine.sources.SourceSpec`: ``"sentences"``, ``"paragraphs"``, ``"tokens:N"`` or
    character spans) for the context attribution methods and source-level views.
    """
    request = target if isinstance(target, Columns) else Target.parse(target)
    text_ends = [len(t) for t in batch.texts]
    if quantity is not None and quantity not in QUANTITIES:
        raise InputError(f"quantity must be one of {', '.join(QUANTITIES)}, got {quantity!r}", hint="use 'logit' or 'log_prob'")
    span = span_request(adapter, request)
    if span is not None:
        if inputs_embeds is not None:
            raise InputError("a span target continues the text; it cannot start from edited embeddings")
        batch, positions = _with_span(adapter, batch, span)
        anchor, anchor_kind = positions[:, -1], "fixed"
    else:
        positions = None
        anchor, anchor_kind = adapter.anchor_positions(batch)
    read_at = anchor if positions is None else positions
    if reference is not None:
        forward = reference(adapter, batch, read_at, inputs_embeds)
    else:
        forward = reference_pass(adapter, batch, read_at, inputs_embeds, hidden_states=hidden_states, attentions=attentions)
    if span is not None:
        text = request.value
        classes = torch.tensor([span] * len(batch), dtype=torch.long)
        resolved = ResolvedTarget(
            anchor, anchor_kind, classes, torch.ones(len(span)), [marked(text)] * len(batch), adapter.task, positions=positions
        )
    else:
        resolved = resolve_target(request, adapter, anchor, anchor_kind, forward.logits.detach())
    resolved.quantity = quantity or ("log_prob" if span is not None else "logit")
    mapped = None if sources is None else map_sources(batch, sources, text_ends)
    return Problem(adapter, batch, resolved, forward, request, inputs_embeds, mapped)


def span_request(adapter: ModelAdapter, request: Target | Columns) -> list[int] | None:
    """The ids of a language-model target of several tokens (a span), else ``None`` (an
    :class:`InputError` for a contrast with a part of several tokens)."""
    if adapter.task not in GENERATIVE or not isinstance(request, Target) or request.kind == "predicted":
        return None
    if request.kind == "contrast":
        if contrast_spans(adapter, request) is not None:
            raise InputError(
                f"contrast {request.value!r} vs {request.foil!r} has a part of several tokens: two continuations, "
                "not one problem",
                hint="explain it with model.explain(texts, method, target='A vs B'), which runs one problem per part",
            )
        return None
    ids = span_ids(adapter, request.value) if isinstance(request.value, str) else [request.value]
    return ids if len(ids) > 1 else None


def contrast_spans(adapter: ModelAdapter, request: Target | Columns) -> tuple[list[int], list[int]] | None:
    """The ids of both parts of a language-model contrast ``"A vs B"`` when a part has several
    tokens (its score is ``log p(A | x) - log p(B | x)``, two continuations), else ``None``."""
    if adapter.task not in GENERATIVE or not isinstance(request, Target) or request.kind != "contrast":
        return None
    parts = [span_ids(adapter, p) if isinstance(p, str) else [p] for p in (request.value, request.foil)]
    return (parts[0], parts[1]) if max(len(p) for p in parts) > 1 else None


def _with_span(adapter: ModelAdapter, batch: Batch, span: list[int]) -> tuple[Batch, torch.Tensor]:
    """``batch`` continued by the span's tokens, and the positions ``[B, K]`` whose outputs
    predict them (position ``P_b - 1 + k`` predicts span token ``k`` after example ``b``'s ``P_b``
    tokens)."""
    start = batch.lengths - 1
    longer = continue_batch(adapter, batch, [span] * len(batch))
    return longer, start[:, None] + torch.arange(len(span))[None, :]
