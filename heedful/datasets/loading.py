"""``heedful.datasets.load``: one entry point for every dataset heedful can evaluate on.

=============================  ================================================================
name                           what it is
=============================  ================================================================
``movies`` ``amazon``          the four human-rated snippet sets of the vaderSentiment archive
``nyt`` ``tweets``             (:mod:`heedful.datasets.vader`): binary ``label`` from the sign of
                               the mean rating, ``rating`` as regression target, fixed
                               train / test splits, lexicon-derived evidence
                               (:mod:`heedful.datasets.evidence`)
``agreement``                  generated agreement minimal pairs following BLiMP's paradigms
                               (:mod:`heedful.datasets.agreement`; not BLiMP)
``planted``                    long contexts of movie-review snippets with one planted answer
                               sentence (:mod:`heedful.datasets.planted`): the source a model
                               must read is known; ``length`` tokens (512 ... 4096), ``seed``
a file path                    the user's CSV / JSON-lines data (:mod:`heedful.datasets.user`),
                               or JSON lines of context documents with ``context`` and
                               ``query`` fields (:mod:`heedful.datasets.context`)
=============================  ================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heedful.datasets import agreement, context, evidence, planted, user, vader
from heedful.datasets.examples import Dataset, Example
from heedful.errors import InputError, did_you_mean

SENTIMENT_LABELS = ("NEGATIVE", "POSITIVE")
"""Names of the snippet sets' label indices 0 and 1 (the zoo models' labels)."""

NAMES: tuple[str, ...] = (*vader.SNIPPET_FILES, "agreement", "planted")

Loader = Callable[..., Dataset]
"""``loader(split, **options) -> Dataset``: a named dataset of the user's."""
_LOADERS: dict[str, Loader] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Make ``loader(split, **options) -> Dataset`` loadable by ``name`` (in :func:`load`, and so
    in ``heedful bench --dataset NAME`` once the module that registers it is imported).

    >>> from heedful.datasets import Dataset, Example
    >>> @register_dataset("two_reviews")
    ... def two_reviews(split="test"):
    ...     texts = ["a charming and often affecting journey", "a dull, lifeless plot"]
    ...     return Dataset("two_reviews", split, [Example(str(i), t, label=1 - i) for i, t in enumerate(texts)])
    >>> load("two_reviews", n=1)[0].text
    'a charming and often affecting journey'
    >>> unregister_dataset("two_reviews")
    """
    if name in NAMES or name in _LOADERS:
        raise ValueError(f"dataset {name!r} is already defined")

    def deco(loader: Loader) -> Loader:
        _LOADERS[name] = loader
        return loader

    return deco


def unregister_dataset(name: str) -> None:
    _LOADERS.pop(name, None)


def load_snippet_set(
    name: str, split: str = "test", threshold: float = evidence.DEFAULT_THRESHOLD
) -> Dataset:
    """A VADER snippet set as a :class:`Dataset`, with lexicon-derived evidence at ``threshold``."""
    frame = vader.load_split(name, split)
    lexicon = vader.vader_lexicon()
    examples = []
    for row in frame.itertuples(index=False):
        words, spans = evidence.lexicon_evidence(row.text, lexicon, threshold)
        examples.append(
            Example(
                id=str(row.id),
                text=row.text,
                label=int(row.label),
                rating=float(row.rating),
                evidence=words,
                evidence_spans=spans,
            )
        )
    return Dataset(
        name=name,
        split=split,
        examples=examples,
        task="sentiment",
        label_names=SENTIMENT_LABELS,
        evidence_source=f"lexicon-derived: VADER lexicon words with |mean valence| >= {threshold}",
        description=f"VADER {vader.SNIPPET_FILES[name]} ({split} split)",
    )


def load(name: str, split: str = "test", n: int | None = None, **options: Any) -> Dataset:
    """Load a dataset by name (see the module docstring) or from a CSV / JSONL file path.

    ``n`` keeps the first ``n`` examples of the split (file order for the snippet sets,
    generation order for agreement pairs). ``options``: ``threshold`` (lexicon evidence) for the
    snippet sets; ``seed``, ``paradigms``, ``causal`` for ``agreement``; ``length``, ``seed``,
    ``tokenizer``, ``distractors`` for ``planted`` (:func:`heedful.datasets.planted.generate`).

    >>> ds = load("movies", "test", n=3)                       # doctest: +SKIP
    >>> ds[0].label, ds[0].evidence                            # doctest: +SKIP
    (1, ('melodramatic',))
    """
    if n is not None and n < 1:
        raise InputError(f"n must be positive, got {n}")
    check_options(name, options)
    if name in vader.SNIPPET_FILES:
        return load_snippet_set(name, split, **options).head(n)
    if name == "agreement":
        return agreement.generate(n or agreement.DEFAULT_SIZE, split, **options)
    if name == "planted":
        return planted.generate(n or planted.DEFAULT_SIZE, split, **options)
    if name in _LOADERS:
        return _LOADERS[name](split, **options).head(n)
    if user.looks_like_path(name):
        wanted = None if split in ("all", None) else split
        if context.is_context_file(name):
            return context.load_context_file(name, wanted).head(n)
        return user.load_file(name, wanted).head(n)
    raise InputError(
        f"unknown dataset {name!r}",
        hint=f"use one of {', '.join((*NAMES, *_LOADERS))}, or the path of a CSV / JSONL file",
    )


OPTIONS: dict[str, set[str]] = {
    **{name: {"threshold"} for name in vader.SNIPPET_FILES},
    "agreement": {"seed", "paradigms", "causal"},
    "planted": {"length", "seed", "tokenizer", "distractors"},
}
"""The options each built-in dataset takes (a data file takes none)."""


def check_options(name: str, options: dict[str, Any]) -> None:
    """An :class:`InputError` naming the first option dataset ``name`` does not take (a
    registered loader checks its own), before anything is loaded."""
    if name in OPTIONS:
        _only(options, OPTIONS[name], name)
    elif name not in _LOADERS and user.looks_like_path(name):
        _only(options, set(), name)


def takes_tokenizer(name: str) -> bool:
    """Whether dataset ``name`` is built with a tokenizer (option ``tokenizer``), so that
    ``heedful bench`` passes it the model's: ``planted``, and registered loaders that take one."""
    if name == "planted":
        return True
    if name in _LOADERS:
        import inspect

        try:
            return "tokenizer" in inspect.signature(_LOADERS[name]).parameters
        except (TypeError, ValueError):
            return False
    return False


def _only(options: dict[str, Any], allowed: set[str], name: str) -> None:
    extra = sorted(set(options) - allowed)
    if extra:
        raise InputError(
            f"dataset {name!r} takes no option {extra[0]!r}",
            hint=did_you_mean(extra[0], sorted(allowed), "option", listing=f"its options: {', '.join(sorted(allowed)) or 'none'}"),
        )
