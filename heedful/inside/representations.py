"""Every layer's representation of character spans of texts: what probes are trained on.

Layer ``0`` is the residual stream entering block 0 (the embedding output, ``block_in``), layer
``l >= 1`` the residual stream leaving block ``l - 1`` (``block_out``) -- ``hidden_states[l]``
of ``transformers``, except that a decoder's last layer is read before its final norm. They
are read through the interception roles (:mod:`heedful.adapters.intercept`), so every family
with roles is covered.

A span ``(start, end)`` of characters of a text becomes the model tokens whose character
offsets overlap it (the tokenizer's ``offset_mapping``; special tokens have none), pooled as
edge probing does (Tenney et al. 2019, Sec. 3.2, with a fixed pooling where they learn
attention weights): the ``mean`` of the tokens, the ``first`` or the ``last``. A pair of spans
(an edge: dependent and head) is the concatenation ``[pool(s1); pool(s2)]``. Examples are
encoded and run in batches; pooling is one tensor contraction per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from heedful.engine.batch import Batch
from heedful.errors import InputError
from heedful.progress import task

POOLINGS = ("mean", "first", "last")


@dataclass(frozen=True)
class Item:
    """One probed thing: characters ``span`` of text ``example`` (``None``: the whole text),
    optionally with a second ``pair`` span (an edge), its ``label`` and the word type
    ``word`` the control task keys its random label on."""

    example: int
    span: tuple[int, int] | None
    label: str
    word: str
    pair: tuple[int, int] | None = None


def span_weights(batch: Batch, example: Sequence[int], spans: Sequence[tuple[int, int] | None], pooling: str) -> torch.Tensor:
    """``[K, N]`` pooling weights of ``K`` spans over their example's ``N`` positions (each row
    sums to 1; a row of zeros: no token overlaps the span). ``None``: the whole text (every
    token of the text with characters; special tokens have no offsets)."""
    weights = torch.zeros(len(spans), batch.seq_len)
    for k, (b, span) in enumerate(zip(example, spans, strict=True)):
        offsets = batch.offsets[b]
        start, end = (0, len(batch.texts[b])) if span is None else span
        # tokens of no characters (a byte-level tokenizer's lone space) belong to no word
        hits = [t for t, o in enumerate(offsets) if o is not None and o[1] > o[0] and o[0] < end and o[1] > start]
        if not hits:
            continue
        if pooling == "mean":
            weights[k, hits] = 1.0 / len(hits)
        else:
            weights[k, hits[0] if pooling == "first" else hits[-1]] = 1.0
    return weights


def layer_states(model, batch: Batch, layers: Sequence[int]) -> torch.Tensor:
    """``[len(layers), B, N, D]``: the residual stream of ``layers`` (0 = embedding output, ``l``
    = after block ``l - 1``) for ``batch``, in one forward pass without gradients."""
    adapter = model.adapter
    blocks = [layer - 1 for layer in layers if layer > 0]
    anchor, _ = adapter.anchor_positions(batch)
    with torch.no_grad(), adapter.intercept() as hooks:
        outs = hooks.record("block_out", blocks) if blocks else {}
        ins = hooks.record("block_in", [0]) if 0 in layers else {}
        adapter.forward(batch, anchor)
    return torch.stack([ins[0] if layer == 0 else outs[layer - 1] for layer in layers])


def check_layers(model, layers: Sequence[int] | str | None) -> list[int]:
    """Layers ``0 .. L`` (``"all"`` / ``None``: every one), checked against the model's ``L`` blocks."""
    count = model.adapter.num_layers
    if layers is None or layers == "all":
        return list(range(count + 1))
    chosen = [int(layer) for layer in layers]
    bad = [layer for layer in chosen if not 0 <= layer <= count]
    if bad or not chosen:
        raise InputError(
            f"layer {bad[0] if bad else '(none)'} does not exist: the model has layers 0 (embeddings) to {count}",
            hint=f"layers='all' or a list of layers between 0 and {count}",
        )
    return sorted(set(chosen))


def span_features(
    model,
    texts: Sequence[str],
    items: Sequence[Item],
    layers: Sequence[int],
    *,
    pooling: str = "mean",
    batch_size: int = 16,
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled representations of ``items`` at ``layers``: ``([len(layers), K, D]`` or ``2 D`` for
    pairs, float32``, kept [K] bool)`` -- an item none of whose tokens survived tokenization
    (truncated away, or only whitespace) is not kept (its row is zero)."""
    if pooling not in POOLINGS:
        raise InputError(f"unknown pooling {pooling!r}", hint=f"choose one of {', '.join(POOLINGS)}")
    by_example: dict[int, list[int]] = {}
    for k, item in enumerate(items):
        by_example.setdefault(item.example, []).append(k)
    width = model.adapter.hidden_size * (2 if any(item.pair is not None for item in items) else 1)
    found = np.zeros((len(layers), len(items), width), dtype=np.float32)
    kept = np.zeros(len(items), dtype=bool)
    examples = sorted(by_example)
    with task("representations", len(examples)) as progress:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            batch = model.encode([texts[e] for e in chunk])
            rows = [k for e in chunk for k in by_example[e]]
            where = {e: i for i, e in enumerate(chunk)}
            owner = [where[items[k].example] for k in rows]
            states = layer_states(model, batch, layers).float()  # [Ls, B, N, D]
            first = span_weights(batch, owner, [items[k].span for k in rows], pooling).to(states.device)
            pooled = _pool(states, owner, first)
            ok = first.sum(dim=1) > 0
            if width > model.adapter.hidden_size:
                second = span_weights(batch, owner, [items[k].pair for k in rows], pooling).to(states.device)
                pooled = torch.cat([pooled, _pool(states, owner, second)], dim=-1)
                ok &= second.sum(dim=1) > 0
            found[:, rows] = pooled.cpu().numpy()
            kept[rows] = ok.cpu().numpy()
            progress.advance(len(chunk))
    return found, kept


def _pool(states: torch.Tensor, owner: Sequence[int], weights: torch.Tensor) -> torch.Tensor:
    """``[Ls, K, D]``: each item's weights ``[K, N]`` over its own example's states ``[Ls, B, N, D]``."""
    spread = torch.zeros(weights.shape[0], states.shape[1], weights.shape[1], dtype=states.dtype, device=states.device)
    spread[torch.arange(weights.shape[0]), torch.as_tensor(list(owner))] = weights.to(states.dtype)
    return torch.einsum("kbn,lbnd->lkd", spread, states)
