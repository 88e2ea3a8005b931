"""Explanation: the one type that carries an attribution result (plain data, no device tensors)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from heedful.engine.readable import marked

if TYPE_CHECKING:
    import pandas as pd

AGGREGATIONS = ("sum", "mean", "max", "first", "last")


@dataclass
class Cost:
    """What an explanation cost, per example: wall seconds and sequences sent forward / backward."""

    seconds: float
    forward_passes: float
    backward_passes: float


@dataclass
class TargetInfo:
    """What was explained: ``kind`` (predicted / given / contrast / regression), output column(s),
    their label, and the anchor position whose head output was explained; ``quantity``: the
    column's logit or log-probability; ``positions``: for a span target, the position read for
    each of its tokens (``indices``)."""

    kind: str
    indices: list[int]
    label: str
    anchor: int
    quantity: str = "logit"
    positions: list[int] | None = None


@dataclass
class WordScores:
    """Scores aggregated from tokens to words. ``scores`` ``[W]`` (or ``[L, W]``)."""

    words: list[str]
    spans: list[tuple[int, int]]
    token_indices: list[list[int]]
    scores: np.ndarray
    aggregation: str

    def __iter__(self):
        return iter(zip(self.words, self.scores.T.tolist() if self.scores.ndim > 1 else self.scores.tolist(), strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "words": self.words,
            "spans": [list(s) for s in self.spans],
            "scores": self.scores.tolist(),
            "aggregation": self.aggregation,
        }


@dataclass
class SourceScores(WordScores):
    """Scores pooled from tokens to sources (sentences, paragraphs, windows or given spans of
    the text, see :mod:`heedful.engine.sources`): ``words[s]`` is source ``s``'s text, ``spans[s]`` its
    character span, ``scores`` ``[S]`` (or ``[L, S]``)."""

    def ranked(self) -> list[tuple[int, str, float]]:
        """``(source index, text, score)`` from the highest score down (last layer for
        layer-wise scores)."""
        flat = self.scores[-1] if self.scores.ndim > 1 else self.scores
        order = np.argsort(-flat, kind="stable")
        return [(int(i), self.words[i], float(flat[i])) for i in order]


class Views:
    """The views every result type shares, from what it defines: ``to_dict``, ``_page`` (a
    self-contained HTML page), ``_snippet`` (HTML for a notebook) and ``_renderable`` (rich)."""

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def _plain(self) -> dict[str, Any]:
        """The result as a dict of its fields with offsets as lists (``to_dict`` then makes the
        scores JSON-ready)."""
        data = asdict(self)
        data["offsets"] = [list(o) if o is not None else None for o in self.offsets]
        return data

    @staticmethod
    def _restored(data: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``to_dict`` output with the fields every result type shares made typed again
        (offsets as tuples, the cost record)."""
        data = dict(data)
        data["offsets"] = [tuple(o) if o is not None else None for o in data["offsets"]]
        data["cost"] = Cost(**data["cost"])
        return data

    def to_html(self, path: str | None = None, **view: Any) -> str:
        """A self-contained HTML page (no network); written to ``path`` when given."""
        page = self._page(**view)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(page)
        return page

    def _repr_html_(self) -> str:
        return self._snippet()

    def __rich_console__(self, console, options):
        yield self._renderable()

    def show(self, **view: Any) -> None:
        """Print it in the terminal."""
        from rich.console import Console

        Console().print(self._renderable(**view))


@dataclass
class Explanation(Views):
    """Token attributions for one text.

    ``tokens`` are the tokenizer's tokens for the text as people read them (each decoded alone,
    line breaks and whitespace-only tokens marked, :mod:`heedful.engine.readable`; special tokens
    included and flagged in ``special``); ``raw_tokens`` the tokenizer's own symbols
    (``'ĠParis'``; equal to ``tokens`` when not given, as in explanations stored before they
    were kept apart); ``scores`` ``[N]`` (or ``[L, N]`` for layer-wise methods, layers
    1..L) give one score per token. ``offsets[i]`` is the character span of token ``i`` in
    ``text`` (or in ``text_pair`` where ``segments[i] == 1``), ``None`` for special tokens;
    ``word_ids[i]`` groups sub-word tokens into words. ``sources``: the character spans of the
    text's sources when it was cut into them (:meth:`source_scores` pools scores per source);
    ``details``: what the method reported besides scores (e.g. ContextCite's fit quality).

    >>> import numpy as np
    >>> e = Explanation(text="hi there", text_pair=None, tokens=["hi", "the", "##re"],
    ...     offsets=[(0, 2), (3, 6), (6, 8)], word_ids=[0, 1, 1], special=[False] * 3,
    ...     segments=[0, 0, 0], scores=np.array([1.0, 0.5, 0.25]),
    ...     target=TargetInfo("predicted", [1], "POSITIVE", 0), method="demo")
    >>> e.words("sum").scores.tolist()
    [1.0, 0.75]
    """

    text: str
    text_pair: str | None
    tokens: list[str]
    offsets: list[tuple[int, int] | None]
    word_ids: list[int | None]
    special: list[bool]
    segments: list[int | None]
    scores: np.ndarray
    target: TargetInfo
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    cost: Cost = field(default_factory=lambda: Cost(0.0, 0.0, 0.0))
    model: str = ""
    prediction: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False
    sources: list[tuple[int, int]] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    raw_tokens: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.raw_tokens:
            self.raw_tokens = list(self.tokens)

    # ------------------------------------------------------------------ views
    @property
    def layerwise(self) -> bool:
        return self.scores.ndim == 2

    def source_text(self, segment: int | None) -> str:
        return self.text_pair if segment == 1 and self.text_pair is not None else self.text

    def words(self, agg: str = "sum") -> WordScores:
        """Aggregate sub-word scores to words with ``agg`` in sum, mean, max, first, last.

        Special tokens are left out. Word text is the span of the original text covered by
        its tokens, marked as tokens are (:func:`heedful.engine.readable.marked`: a line break is ``⏎``).
        """
        if agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(self.word_ids):
            if w is not None and not self.special[i]:
                groups.setdefault(w, []).append(i)
        order = sorted(groups)
        reducers = {
            "sum": lambda s: s.sum(axis=-1),
            "mean": lambda s: s.mean(axis=-1),
            "max": lambda s: s.max(axis=-1),
            "first": lambda s: s[..., 0],
            "last": lambda s: s[..., -1],
        }
        words, spans, token_lists, columns = [], [], [], []
        for w in order:
            idx = groups[w]
            start, end = self.offsets[idx[0]][0], self.offsets[idx[-1]][1]
            words.append(marked(self.source_text(self.segments[idx[0]])[start:end]))
            spans.append((start, end))
            token_lists.append(idx)
            columns.append(reducers[agg](self.scores[..., idx]))
        scores = np.stack(columns, axis=-1) if columns else np.zeros(self.scores.shape[:-1] + (0,))
        return WordScores(words, spans, token_lists, scores, agg)

    def source_scores(self, agg: str = "sum") -> SourceScores:
        """Token scores pooled per source with ``agg`` (``sum`` by default: a context method's
        source score exactly, a gradient method's summed over the source's tokens). Needs the
        explanation's ``sources`` (``explain(..., sources="sentences")``)."""
        from heedful.engine.sources import token_sources

        if self.sources is None:
            raise ValueError("this explanation has no sources; explain with sources='sentences' (or paragraphs, tokens:N, spans)")
        if agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
        owner = np.asarray(token_sources([o if seg == 0 else None for o, seg in zip(self.offsets, self.segments, strict=True)], self.sources))
        reduce = {"sum": np.sum, "mean": np.mean, "max": np.max, "first": lambda v, axis: v[..., 0], "last": lambda v, axis: v[..., -1]}[agg]
        members = [np.flatnonzero(owner == s).tolist() for s in range(len(self.sources))]
        columns = [reduce(self.scores[..., idx], axis=-1) if idx else np.zeros(self.scores.shape[:-1]) for idx in members]
        scores = np.stack(columns, axis=-1) if columns else np.zeros(self.scores.shape[:-1] + (0,))
        texts = [self.text[a:b] for a, b in self.sources]
        return SourceScores(texts, list(self.sources), members, scores, agg)

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` highest-scoring non-special tokens (last layer for layer-wise scores)."""
        flat = self.scores[-1] if self.layerwise else self.scores
        order = [i for i in np.argsort(-flat, kind="stable") if not self.special[i]]
        return [(self.tokens[i], float(flat[i])) for i in order[:k]]

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (scores as lists)."""
        data = self._plain()
        data["scores"] = self.scores.tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        data = cls._restored(data)
        data["scores"] = np.asarray(data["scores"], dtype=float)
        data["target"] = TargetInfo(**data["target"])
        if data.get("sources") is not None:
            data["sources"] = [tuple(s) for s in data["sources"]]
        return cls(**data)

    def to_pandas(self) -> pd.DataFrame:
        """One row per token: position, token (as people read it), raw token (the
        tokenizer's symbol), word id, special flag, offsets and score (one ``layer_k`` column per
        layer for layer-wise scores)."""
        import pandas as pd

        frame = pd.DataFrame(
            {
                "position": range(len(self.tokens)),
                "token": self.tokens,
                "raw_token": self.raw_tokens,
                "word_id": self.word_ids,
                "special": self.special,
                "start": [o[0] if o else None for o in self.offsets],
                "end": [o[1] if o else None for o in self.offsets],
            }
        )
        if self.layerwise:
            for layer, row in enumerate(self.scores, start=1):
                frame[f"layer_{layer}"] = row
        else:
            frame["score"] = self.scores
        return frame

    # ------------------------------------------------------------------ rendering
    def _page(self, words: bool = False) -> str:
        from heedful.render.html import explanation_page

        return explanation_page([self], words=words)

    def _snippet(self) -> str:
        from heedful.render.html import explanation_fragment

        return explanation_fragment(self)

    def _renderable(self, words: bool = False):
        from heedful.render.terminal import explanation_renderable

        return explanation_renderable(self, words)


class Explanations(list):
    """A list of :class:`Explanation` (several texts, or several methods on one text) that
    renders inline in Jupyter: ``_repr_html_`` is every explanation's own ``_repr_html_`` in
    order, in one box (:func:`heedful.render.html.explanations_fragment`) -- the fragments
    ``heedful serve``'s page shows side by side. Otherwise a plain ``list``.

    >>> Explanations()._repr_html_()
    '<div class="hf-many"></div>'
    """

    def _repr_html_(self) -> str:
        from heedful.render.html import explanations_fragment

        return explanations_fragment(self)

    def to_html(self, path: str | None = None, words: bool = False, title: str = "heedful") -> str:
        """A self-contained HTML page of every explanation (no network); written to ``path`` when given."""
        from heedful.render.html import explanation_page

        page = explanation_page(self, words=words, title=title)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(page)
        return page

    def to_json(self, indent: int | None = None) -> str:
        """Every explanation's ``to_dict`` in a JSON list."""
        return json.dumps([e.to_dict() for e in self], indent=indent)
