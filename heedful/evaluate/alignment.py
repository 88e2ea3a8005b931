"""Imported explanations (:class:`~heedful.evaluate.imported_records.Record`) aligned to a
heedful model's own tokens: by token ids one to one, by equal tokens, else by character spans
(each model token gets the sum of the scores of the imported tokens its characters overlap); a
token that cannot be placed is a one-line :class:`AlignmentError` naming the example, the
position and the fix (the rules: :mod:`heedful.evaluate.imports`)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from heedful.engine.targets import Columns, Target
from heedful.errors import InputError
from heedful.evaluate.imported_records import Record
from heedful.explanation import Cost, Explanation, Explanations
from heedful.model import Model

SPECIAL_LIKE = re.compile(r"^(\[[A-Za-z_]+\]|<[^<>\s]+>|<\|[^|\s]+\|>)$")
"""Tokens that look special (``[CLS]``, ``</s>``, ``<|endoftext|>``) though another tokenizer's."""

_MARKERS = (("Ġ", " "), ("▁", " "), ("Ċ", "\n"), ("ĉ", "\t"))


class AlignmentError(InputError):
    """An imported explanation whose tokens cannot be matched to the model's."""


@dataclass
class _Side:
    """The model's encoding of one example: tokens, ids, offsets, special flags, segments."""

    tokens: list[str]
    ids: list[int]
    offsets: list[tuple[int, int] | None]
    special: list[bool]
    segments: list[int | None]
    truncated: bool


def _fail(item: Record, message: str, hint: str) -> AlignmentError:
    return AlignmentError(f"example {item.id!r}: {message}", hint=hint)


def _by_ids(item: Record, side: _Side, special_ids: set[int]) -> np.ndarray:
    """``[N, M]`` 0/1: imported token ``j`` is model token ``i`` (same id, in order)."""
    ids = item.token_ids or []
    n, m = len(side.ids), len(ids)
    mapping = np.zeros((n, m))
    i = j = 0
    while i < n and j < m:
        if side.ids[i] == ids[j]:
            mapping[i, j] = 1.0
            i, j = i + 1, j + 1
        elif side.special[i]:
            i += 1
        elif ids[j] in special_ids:
            j += 1
        else:
            raise _fail(
                item,
                f"imported token {j} (id {ids[j]}) differs from the model's token {i} ({side.tokens[i]!r}, id {side.ids[i]})",
                "give ids from this model's tokenizer, or drop token_ids to align by text",
            )
    while i < n and side.special[i]:
        i += 1
    if i < n:
        raise _fail(
            item,
            f"the imported ids end at token {m}, before the model's token {i} ({side.tokens[i]!r})",
            "give the ids of the whole text (the same text the explanation was computed for)",
        )
    rest = [k for k in range(j, m) if ids[k] not in special_ids]
    if rest and not side.truncated:
        raise _fail(
            item,
            f"imported token {rest[0]} (id {ids[rest[0]]}) has no counterpart among the model's {n} tokens",
            "give ids from this model's tokenizer for exactly this text",
        )
    return mapping


def _fold(text: str) -> tuple[str, list[int]]:
    """``text`` case-folded with accents dropped, and the index in ``text`` of each character."""
    chars, where = [], []
    for k, ch in enumerate(text):
        for c in unicodedata.normalize("NFKD", ch).casefold():
            if not unicodedata.combining(c):
                chars.append(c)
                where.append(k)
    return "".join(chars), where


def _clean(token: str, tokenizer: Any) -> list[str]:
    """Candidate surface forms of ``token`` (sub-word markers dropped; the tokenizer's own
    reading of a byte-level token)."""
    found = []
    plain = token[2:] if token.startswith("##") else token
    for marker, char in _MARKERS:
        plain = plain.replace(marker, char)
    found.append(plain.strip())
    try:
        decoded = tokenizer.convert_tokens_to_string([token]).strip()
    except Exception:  # a token the tokenizer does not know
        decoded = ""
    if decoded and decoded not in found and not decoded.startswith("##"):
        found.append(decoded)
    return [f for f in found if f]


def _spans_from_tokens(item: Record, tokenizer: Any) -> tuple[list[tuple[int, int, int] | None], list[bool]]:
    """Each imported token's ``(segment, start, end)`` found in the text(s) left to right, and
    whether it is special (no span). Only whitespace may lie between consecutive tokens."""
    specials = set(getattr(tokenizer, "all_special_tokens", []))
    unk = getattr(tokenizer, "unk_token", None)
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    folded = [_fold(t) for t in texts]
    segment, cursor = 0, 0
    spans: list[tuple[int, int, int] | None] = []
    special: list[bool] = []
    pending: int | None = None  # an unknown token waiting for the next token's start
    for j, token in enumerate(item.tokens or []):
        if token == unk or token in specials or SPECIAL_LIKE.match(token):
            if token == unk or token in ("[UNK]", "<unk>"):
                pending = j
                spans.append(None)
                special.append(False)
                continue
            spans.append(None)
            special.append(True)
            continue
        forms = _clean(token, tokenizer)
        if not forms:  # whitespace only
            spans.append(None)
            special.append(True)
            continue
        located = None
        for seg in range(segment, len(texts)):
            text, where = folded[seg]
            start_at = cursor if seg == segment else 0
            lo = next((p for p, k in enumerate(where) if k >= start_at), len(where))
            for form in forms:
                f, _ = _fold(form)
                hit = text.find(f, lo)
                if hit < 0:
                    continue
                gap = texts[seg][start_at : where[hit]] if hit < len(where) else ""
                if gap.strip() and pending is None:
                    continue
                located = (seg, where[hit], where[hit + len(f) - 1] + 1, gap)
                break
            if located is not None:
                break
            if pending is not None:
                break
        if located is None:
            position = f"character {cursor} of text{'_pair' if segment else ''}"
            raise _fail(
                item,
                f"token {j} ({token!r}) is not found at {position}",
                "give character 'offsets' of the tokens, or 'token_ids' from this model's tokenizer",
            )
        seg, start, end, gap = located
        if pending is not None:
            lead = len(gap) - len(gap.lstrip())
            begin = (cursor if seg == segment else 0) + lead
            spans[pending] = (seg, begin, begin + len(gap.strip())) if gap.strip() else None
            pending = None
        spans.append((seg, start, end))
        special.append(False)
        segment, cursor = seg, end
    if pending is not None:
        rest = texts[segment][cursor:]
        lead = len(rest) - len(rest.lstrip())
        word = rest.strip().split()[0] if rest.strip() else ""
        spans[pending] = (segment, cursor + lead, cursor + lead + len(word)) if word else None
    return spans, special


def _spans_from_offsets(item: Record) -> tuple[list[tuple[int, int, int] | None], list[bool]]:
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    if item.text_pair is not None and item.segments is None:
        raise _fail(item, "offsets of a text pair need 'segments'", "give 'segments' (0: text, 1: text_pair) beside the offsets")
    spans: list[tuple[int, int, int] | None] = []
    special: list[bool] = []
    for j, offset in enumerate(item.offsets or []):
        seg = 0 if item.segments is None or item.segments[j] is None else int(item.segments[j])
        if offset is None or offset[0] == offset[1]:
            spans.append(None)
            special.append(True)
            continue
        start, end = offset
        if seg not in (0, 1) or seg >= len(texts) or not 0 <= start < end <= len(texts[seg]):
            raise _fail(
                item,
                f"token {j} has offsets [{start}, {end}] outside its text ({len(texts[min(seg, len(texts) - 1)])} characters)",
                "give offsets into the record's text",
            )
        spans.append((seg, start, end))
        special.append(False)
    return spans, special


def _by_spans(item: Record, side: _Side, tokenizer: Any) -> tuple[np.ndarray, str]:
    """``[N, M]``: model token ``i`` takes imported token ``j``'s score when their characters
    overlap (special tokens: matched in order by their text)."""
    how = "offsets" if item.offsets is not None else "tokens"
    spans, special = _spans_from_offsets(item) if item.offsets is not None else _spans_from_tokens(item, tokenizer)
    n, m = len(side.tokens), item.width
    mapping = np.zeros((n, m))
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    reach = [0, 0]  # the end of what the model covers, per segment
    for i in range(n):
        if side.offsets[i] is not None and not side.special[i]:
            seg = side.segments[i] or 0
            reach[seg] = max(reach[seg], side.offsets[i][1])
    for j, span in enumerate(spans):
        if span is None:
            continue
        seg, start, end = span
        hits = [
            i for i in range(n)
            if not side.special[i] and side.offsets[i] is not None and (side.segments[i] or 0) == seg
            and max(start, side.offsets[i][0]) < min(end, side.offsets[i][1])
        ]
        if hits:
            mapping[hits, j] = 1.0
        elif texts[seg][start:end].strip() and not (side.truncated and start >= reach[seg]):
            raise _fail(
                item,
                f"imported token {j} ({texts[seg][start:end]!r}, characters {start}-{end}) overlaps none of the model's tokens",
                "give the text the explanation was computed for",
            )
    if item.tokens is not None:  # special tokens of the same text, in order
        model_specials = [i for i in range(n) if side.special[i]]
        for j in [j for j in range(m) if special[j]]:
            match = next((i for i in model_specials if side.tokens[i] == item.tokens[j]), None)
            if match is not None:
                mapping[match, j] = 1.0
                model_specials = model_specials[model_specials.index(match) + 1 :]
    covered = mapping.sum(axis=1) > 0
    for i in range(n):
        if not side.special[i] and side.offsets[i] is not None and not covered[i]:
            start, end = side.offsets[i]
            if not texts[side.segments[i] or 0][start:end].strip():
                continue
            raise _fail(
                item,
                f"the model's token {i} ({side.tokens[i]!r}, characters {start}-{end}) is covered by no imported token",
                f"give {'offsets' if how == 'offsets' else 'tokens'} that cover the whole text (or the model's token ids)",
            )
    return mapping, how


def mapping(item: Record, side: _Side, tokenizer: Any) -> tuple[np.ndarray, str]:
    """How ``item``'s scores land on the model's tokens: ``[N, M]`` weights and how it was
    aligned (``"token ids"``, ``"tokens"`` equal to the model's, ``"offsets"`` or ``"tokens"``
    found in the text)."""
    if item.token_ids is not None:
        specials = set(getattr(tokenizer, "all_special_ids", []))
        return _by_ids(item, side, specials), "token ids"
    if item.tokens is not None and item.tokens == side.tokens:
        return np.eye(len(side.tokens)), "same tokens"
    if item.tokens is None and item.offsets is None:
        raise _fail(
            item,
            f"{item.width} scores and nothing that says which tokens they belong to",
            "give 'tokens', 'offsets' or 'token_ids' with the scores",
        )
    return _by_spans(item, side, tokenizer)


def _target(model: Model, group: list[Record]) -> Target | Columns:
    first = group[0]
    if first.target_indices is not None:
        labels = tuple(
            " vs ".join(model.adapter.output_name(i) for i in r.target_indices) for r in group  # type: ignore[union-attr]
        )
        weights = (1.0,) if len(first.target_indices) == 1 else (1.0, -1.0)
        return Columns(tuple(r.target_indices for r in group), weights, labels)  # type: ignore[misc]
    return Target.parse(first.target)


def _group_key(item: Record) -> tuple:
    if item.target_indices is not None:
        return ("columns", len(item.target_indices), item.text_pair is not None)
    return ("target", repr(item.target), item.text_pair is not None)


def align(
    model: Model,
    items: Sequence[Record],
    name: str = "imported",
    *,
    max_length: int | None = None,
    batch_size: int = 16,
    options: Mapping[str, Any] | None = None,
) -> Explanations:
    """Heedful :class:`~heedful.Explanation` s of ``items`` on ``model``'s tokens (in order),
    recorded as method ``name`` with ``options``; ``details`` hold the example id and how it was
    aligned. Texts are cut to ``max_length`` tokens like heedful's own explanations. An item
    that cannot be aligned is an :class:`AlignmentError` -- or, when it is ``optional``, left
    out (compare the ids in ``details``)."""
    if batch_size < 1:
        raise InputError(f"batch_size must be positive, got {batch_size}")
    tokenizer = model.tokenizer
    groups: dict[tuple, list[int]] = {}
    for k, item in enumerate(items):
        groups.setdefault(_group_key(item), []).append(k)
    found: dict[int, Explanation] = {}
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            part = [items[k] for k in members[start : start + batch_size]]
            pairs = [r.text_pair for r in part]
            problem = model.prepare(
                [r.text for r in part], _target(model, part),
                text_pair=pairs if any(p is not None for p in pairs) else None, max_length=max_length,
            )
            batch = problem.batch
            layers = {r.scores.shape[0] if r.scores.ndim == 2 else 0 for r in part}
            if len(layers) > 1:
                raise InputError(
                    f"records {part[0].id!r} .. {part[-1].id!r} mix token scores and layer-wise scores",
                    hint="import layer-wise and per-token explanations separately",
                )
            depth = layers.pop()
            scores = torch.zeros((len(part), depth, batch.seq_len) if depth else (len(part), batch.seq_len), dtype=torch.float64)
            how = []
            for b, item in enumerate(part):
                n = len(batch.tokens[b])
                side = _Side(
                    tokens=batch.tokens[b], ids=batch.input_ids[b, :n].tolist(), offsets=batch.offsets[b],
                    special=batch.special_mask[b, :n].bool().tolist(), segments=batch.sequence_ids[b],
                    truncated=bool(batch.truncated[b]) if batch.truncated else False,
                )
                try:
                    weights, aligned = mapping(item, side, tokenizer)
                except AlignmentError:
                    if not item.optional:
                        raise
                    how.append(None)
                    continue
                values = np.nan_to_num(item.scores, nan=0.0) @ weights.T  # [N] or [L, N]
                scores[b, ..., :n] = torch.from_numpy(values)
                how.append(aligned)
            made = model.explanations(problem, scores, name, dict(options or {}), Cost(0.0, 0.0, 0.0))
            for k, expl, item, aligned in zip(members[start : start + batch_size], made, part, how, strict=True):
                if aligned is not None:
                    found[k] = replace(expl, details={**expl.details, "example_id": item.id, "aligned_by": aligned})
    return Explanations([found[k] for k in range(len(items)) if k in found])


