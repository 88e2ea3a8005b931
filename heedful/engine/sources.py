"""Sources: a long text cut into the units a context attribution ranks -- sentences,
paragraphs, fixed token windows or the user's own spans -- with their character offsets, and
every token of an encoded batch mapped to the source it belongs to.

A source is a character span ``(start, end)`` of the text, trimmed of surrounding white space.
Sentences follow ContextCite's splitter in kind: the text is cut into lines, each line after
sentence-final punctuation (``. ! ?``, with closing quotes and brackets) that is followed by
white space; a piece without a letter (``"..."``, a list marker such as ``"1."``) joins the
sentence before it on its line, or the one after it when it opens the line. Paragraphs are separated by blank lines. ``within`` limits the split to a region
of the text (the context, not the question asked about it): tokens outside every source belong
to none.

>>> spec = SourceSpec.parse("sentences")
>>> split_text("It rained. We stayed in!\\nThe end.", spec)
[(0, 10), (11, 24), (25, 33)]
>>> SourceSpec.parse("tokens:32").size
32
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from heedful.errors import InputError

if TYPE_CHECKING:  # sources sit below the batch: the datasets cut their texts with them
    from heedful.engine.batch import Batch

KINDS = ("sentences", "paragraphs", "tokens", "spans")
SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
LETTER = re.compile(r"[^\W\d_]")

Span = tuple[int, int]


@dataclass(frozen=True)
class SourceSpec:
    """How to cut a text into sources: ``kind`` in ``sentences`` (default), ``paragraphs``,
    ``tokens`` (windows of ``size`` tokens) or ``spans`` (the given character ``spans``);
    ``within``: the character region ``(start, end)`` to cut (default the whole text)."""

    kind: str = "sentences"
    size: int = 64
    spans: tuple[Span, ...] = ()
    within: Span | None = None

    @classmethod
    def parse(cls, spec: SourceSpec | str | Sequence[Span] | None, within: Span | None = None) -> SourceSpec:
        """From ``None`` (sentences), ``"sentences"``, ``"paragraphs"``, ``"tokens:N"`` (windows
        of N tokens; ``"tokens"`` alone: 64), a list of ``(start, end)`` character spans, or a
        :class:`SourceSpec`."""
        if isinstance(spec, SourceSpec):
            return spec if within is None else replace(spec, within=within)
        if spec is None:
            return cls(within=within)
        if isinstance(spec, str):
            name, _, size = spec.partition(":")
            if name not in KINDS[:3] or (size and name != "tokens"):
                raise InputError(
                    f"unknown sources {spec!r}",
                    hint="use sentences, paragraphs, tokens:N (windows of N tokens) or a list of (start, end) spans",
                )
            if not size:
                return cls(name, within=within)
            if not size.isdigit() or int(size) < 1:
                raise InputError(f"token windows need a positive size, got {size!r}", hint="e.g. tokens:64")
            return cls(name, int(size), within=within)
        spans = []
        for item in spec:
            if not (isinstance(item, Sequence) and len(item) == 2 and all(isinstance(v, int) for v in item)):
                raise InputError(f"source {item!r} is not a (start, end) pair of character offsets")
            start, end = item
            if not 0 <= start < end:
                raise InputError(f"source span {item!r} is empty or negative", hint="give (start, end) with 0 <= start < end")
            spans.append((start, end))
        if not spans:
            raise InputError("no source spans given", hint="give at least one (start, end) span")
        return cls("spans", spans=tuple(sorted(spans)), within=within)


def _trimmed(text: str, start: int, end: int) -> Span | None:
    piece = text[start:end]
    left = len(piece) - len(piece.lstrip())
    right = len(piece.rstrip())
    return (start + left, start + right) if right > left else None


def _cut(text: str, start: int, end: int, breaks: re.Pattern[str], keep_break: bool) -> list[Span]:
    """``text[start:end]`` cut after (``keep_break``) or around each match of ``breaks``."""
    pieces, begin = [], start
    for match in breaks.finditer(text, start, end):
        pieces.append((begin, match.end() if keep_break else match.start()))
        begin = match.end()
    pieces.append((begin, end))
    return [s for a, b in pieces if (s := _trimmed(text, a, b)) is not None]


def _sentences(text: str, start: int, end: int) -> list[Span]:
    spans: list[Span] = []
    for line in _cut(text, start, end, re.compile(r"\n"), keep_break=False):
        first = len(spans)
        opening: int | None = None  # letterless pieces that open the line join the sentence after them
        for piece in _cut(text, *line, SENTENCE_END, keep_break=True):
            if LETTER.search(text[piece[0] : piece[1]]):
                spans.append(piece if opening is None else (opening, piece[1]))
                opening = None
            elif len(spans) > first:  # "... mostly": a letterless piece joins the sentence before it
                spans[-1] = (spans[-1][0], piece[1])
            elif opening is None:
                opening = piece[0]
        if opening is not None:  # a line without a letter is a source of its own
            spans.append((opening, line[1]))
    return spans


def split_text(text: str, spec: SourceSpec) -> list[Span]:
    """The character spans of ``text``'s sources (sentences or paragraphs; the given spans,
    checked against the text). Token windows need the tokens: see :func:`map_sources`."""
    start, end = spec.within or (0, len(text))
    if not 0 <= start < end <= len(text):
        raise InputError(f"source region {spec.within} is outside the text of {len(text)} characters")
    if spec.kind == "sentences":
        return _sentences(text, start, end)
    if spec.kind == "paragraphs":
        return _cut(text, start, end, PARAGRAPH_BREAK, keep_break=False)
    if spec.kind == "spans":
        bad = [s for s in spec.spans if s[1] > len(text)]
        if bad:
            raise InputError(f"source span {bad[0]} ends past the text of {len(text)} characters")
        return list(spec.spans)
    raise InputError(f"{spec.kind} sources are cut from tokens", hint="use map_sources on an encoded batch")


def token_sources(offsets: Sequence[Span | None], spans: Sequence[Span]) -> list[int]:
    """The source of every token (``-1``: none): the span holding the token's last character
    (a byte-level token ``" The"`` starts at the space before its sentence). ``spans`` sorted."""
    last = np.array([o[1] - 1 if o is not None and o[1] > o[0] else -1 for o in offsets], dtype=np.int64)
    if not spans:
        return [-1] * len(last)
    starts, ends = np.array(spans, dtype=np.int64).T
    found = np.searchsorted(starts, last, side="right") - 1
    inside = (found >= 0) & (last >= 0) & (last < ends[found.clip(min=0)])
    return np.where(inside, found, -1).tolist()


def _windows(offsets: Sequence[Span | None], segments: Sequence[int | None], spec: SourceSpec, text: str) -> list[Span]:
    start, end = spec.within or (0, len(text))
    inside = [o for o, s in zip(offsets, segments, strict=True) if o is not None and s == 0 and start <= o[1] - 1 < end and o[1] > o[0]]
    spans = []
    for i in range(0, len(inside), spec.size):
        group = inside[i : i + spec.size]
        span = _trimmed(text, max(group[0][0], start), min(group[-1][1], end))
        if span is not None:
            spans.append(span)
    return spans


@dataclass
class SourceMap:
    """The sources of every example of a batch: ``spans[b]`` their character spans in
    ``batch.texts[b]``; ``ids`` ``[B, N]``: the source of every token (``-1``: none, padding
    included); ``spec``: how they were cut."""

    spans: list[list[Span]]
    ids: torch.Tensor
    spec: SourceSpec

    @property
    def counts(self) -> torch.Tensor:
        """Number of sources per example ``[B]``."""
        return torch.tensor([len(s) for s in self.spans], dtype=torch.long, device=self.ids.device)

    def members(self) -> torch.Tensor:
        """``[B, S, N]`` bool: token ``n`` of example ``b`` belongs to source ``s`` (``S`` the
        most sources of any example)."""
        width = max(int(self.counts.max()), 1) if self.spans else 1
        return self.ids[:, None, :] == torch.arange(width, device=self.ids.device)[None, :, None]

    def pool(self, scores: torch.Tensor) -> torch.Tensor:
        """Token scores ``[B, N]`` summed per source ``[B, S]`` (0 past an example's sources)."""
        return torch.einsum("bsn,bn->bs", self.members().to(scores), scores)

    def spread(self, values: torch.Tensor) -> torch.Tensor:
        """Per-source values ``[B, S]`` as token scores ``[B, N]``: each source's value shared
        evenly by its tokens (so that :meth:`pool` gives the values back), 0 outside sources."""
        members = self.members().to(values)
        sizes = members.sum(dim=2).clamp(min=1)
        return torch.einsum("bsn,bs->bn", members, values / sizes)

    def select(self, rows: Sequence[int], width: int) -> SourceMap:
        return replace(self, spans=[self.spans[i] for i in rows], ids=self.ids[list(rows), :width])


def map_sources(
    batch: Batch, spec: SourceSpec | str | Sequence[Span] | None, ends: Sequence[int] | None = None
) -> SourceMap:
    """Cut every text of ``batch`` into sources and map its tokens to them (only tokens of the
    first text segment; special tokens belong to none). ``ends[b]``: where example ``b``'s own
    text ends (a text continued by a span target: the span is no source)."""
    given = SourceSpec.parse(spec)
    ids = torch.full(batch.input_ids.shape, -1, dtype=torch.long, device=batch.input_ids.device)
    spans_of: list[list[Span]] = []
    for b, text in enumerate(batch.texts):
        spec = given
        if ends is not None:
            start, end = given.within or (0, ends[b])
            spec = replace(given, within=(start, min(end, ends[b])))
        offsets = [o if s == 0 else None for o, s in zip(batch.offsets[b], batch.sequence_ids[b], strict=True)]
        if spec.kind == "tokens":
            spans = _windows(batch.offsets[b], batch.sequence_ids[b], spec, text)
        else:
            spans = split_text(text, spec)
        tokens = token_sources(offsets, spans)
        ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=ids.device)
        spans_of.append(spans)
    return SourceMap(spans_of, ids, given)
