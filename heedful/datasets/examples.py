"""Plain containers for evaluation data: an :class:`Example` and a :class:`Dataset` of them.

Every loader in :mod:`heedful.datasets` (the VADER snippet sets, the agreement minimal pairs,
user CSV / JSONL files) returns a :class:`Dataset`, so the evaluation layer never needs to know
where examples came from.

Evidence is stored as *character spans* (``(segment, start, end)``; segment 0 is ``text``, 1 is
``text_pair``) rather than token positions, because token positions depend on the tokenizer:
:func:`heedful.datasets.evidence.token_evidence` maps spans to the token positions of any
tokenizer through its character offsets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from heedful.errors import InputError

Span = tuple[int, int, int]
"""``(segment, start, end)``: characters ``start:end`` of ``text`` (segment 0) or ``text_pair`` (1)."""


@dataclass(frozen=True)
class Example:
    """One evaluation example.

    ``label``: gold class (index or label name) for classification; ``rating``: gold value for
    regression (the snippet sets carry both). ``evidence`` lists the evidence words and
    ``evidence_spans`` their character spans. For language-model examples (agreement pairs)
    ``target`` is the word the model should predict at ``target_span`` of ``text`` and ``foil``
    the minimally different wrong word.
    """

    id: str
    text: str
    text_pair: str | None = None
    label: int | str | None = None
    rating: float | None = None
    evidence: tuple[str, ...] = ()
    evidence_spans: tuple[Span, ...] = ()
    target: str | None = None
    foil: str | None = None
    target_span: tuple[int, int] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ language-model views
    @property
    def prefix(self) -> str:
        """The text before the target word (what a causal LM reads to predict it)."""
        if self.target_span is None:
            raise InputError(f"example {self.id} has no target word", hint="only agreement pairs have one")
        return self.text[: self.target_span[0]].rstrip()

    def masked(self, mask_token: str) -> str:
        """``text`` with the target word replaced by ``mask_token`` (what a masked LM reads)."""
        if self.target_span is None:
            raise InputError(f"example {self.id} has no target word", hint="only agreement pairs have one")
        start, end = self.target_span
        return self.text[:start] + mask_token + self.text[end:]

    @property
    def evidence_before_target(self) -> bool:
        """Whether every evidence span ends before the target starts (usable by causal LMs)."""
        if self.target_span is None:
            return True
        return all(seg == 0 and end <= self.target_span[0] for seg, _, end in self.evidence_spans)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["evidence"] = list(self.evidence)
        data["evidence_spans"] = [list(s) for s in self.evidence_spans]
        data["target_span"] = list(self.target_span) if self.target_span else None
        data["meta"] = dict(self.meta)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Example:
        data = dict(data)
        data["evidence"] = tuple(data.get("evidence") or ())
        data["evidence_spans"] = tuple(tuple(s) for s in data.get("evidence_spans") or ())
        span = data.get("target_span")
        data["target_span"] = tuple(span) if span else None
        return cls(**data)


@dataclass
class Dataset:
    """A named, split list of :class:`Example`.

    ``task`` is what the gold annotations support: ``"classification"`` (``label``),
    ``"regression"`` (``rating``), ``"sentiment"`` (both), ``"agreement"`` (target / foil words
    for language models), ``"context"`` (a prompt with sources and the continuation to explain,
    :mod:`heedful.datasets.context`) or ``"unlabelled"``. ``label_names[i]`` names class index ``i`` so that
    gold labels can be matched to a model's labels by name. ``evidence_source`` says where the
    evidence came from (reports must say that lexicon evidence is lexicon-derived).
    """

    name: str
    split: str
    examples: list[Example]
    task: str = "classification"
    label_names: tuple[str, ...] | None = None
    evidence_source: str | None = None
    description: str = ""

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, split={self.split!r}, {len(self)} examples, task={self.task!r})"

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.examples]

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.examples]

    def _with(self, examples: Sequence[Example]) -> Dataset:
        return replace(self, examples=list(examples))

    def head(self, n: int | None) -> Dataset:
        """The first ``n`` examples (all of them when ``n`` is None)."""
        if n is None:
            return self._with(self.examples)
        if n < 1:
            raise InputError(f"n must be positive, got {n}")
        return self._with(self.examples[:n])

    def filter(self, keep: Callable[[Example], bool]) -> Dataset:
        return self._with([e for e in self.examples if keep(e)])

    def to_pandas(self):
        """One row per example (evidence as lists)."""
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.examples])

    def to_jsonl(self, path: str) -> None:
        """Write the examples as JSON lines (readable back with ``heedful.datasets.load(path)``)."""
        with open(path, "w", encoding="utf-8") as fh:
            for e in self.examples:
                fh.write(json.dumps(e.to_dict()) + "\n")
