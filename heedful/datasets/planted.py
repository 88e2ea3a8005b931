"""Planted long-context documents: movie-review snippets with one planted answer sentence, so
that the source a model must read to answer is known by construction.

Each document is a run of VADER movie-review snippets (:mod:`heedful.datasets.vader`, the
split asked for), one snippet per line, with ``1 + distractors`` sentences of one template put
between them at seeded random places::

    The soundtrack was superb.          <- the planted answer sentence
    The lighting was dreadful.          <- distractors: other subjects, other ratings

After the document come a blank line and the question, the planted sentence cut before its last
word, which a small causal LM answers by copying: ``"The soundtrack was"`` -> ``" superb"``.
Subjects are film aspects (:data:`SUBJECTS`) and ratings adjectives (:data:`ANSWERS`), each a
single token for the SmolLM2 tokenizer (and GPT-2's); no distractor shares the planted rating,
and no snippet of a document mentions any of its subjects, so exactly one sentence answers the
question. On the zoo's ``smollm2-135m`` this template was the easiest of five tried to copy
(``"The reviewers rated the soundtrack superb."``, ``"Verdict on the soundtrack: superb."`` ...
were answered less often).

The examples are context examples (:mod:`heedful.datasets.context`): ``text`` is the document,
a blank line and the question; ``target`` the answer with its leading space (``" superb"``);
``meta["sources"]`` the character spans of every sentence of the document -- each snippet's
sentences (as :func:`heedful.engine.sources.split_text` cuts any text) and each template sentence -- (the question is no
source); ``meta["answer_source"]`` the index of the planted sentence among them and
``evidence_spans`` its character span.

Length
------
``length`` is the number of tokens the prompt (document and question) may take; snippets are
added in a seeded random order while they fit. With a ``tokenizer`` the tokens are counted
with it (special tokens it adds included), else estimated as characters /
:data:`CHARS_PER_TOKEN` (4.5: the SmolLM2 tokenizer gives 4.55 characters per token on the
movie snippets of both splits). ``heedful bench`` passes the model's tokenizer.

Determinism
-----------
Document ``i`` of a split draws from ``numpy.random.default_rng([seed, split, i])`` (split 0
train, 1 test) whatever ``n`` and ``length`` are: any prefix of a set is the same, and the
documents of two lengths share their subjects, ratings and the planted sentence's relative
place. Train documents are made of train snippets, test documents of test snippets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from heedful.datasets import vader
from heedful.datasets.context import SEPARATOR, context_example
from heedful.datasets.examples import Dataset, Example
from heedful.engine.sources import SourceSpec, split_text
from heedful.errors import InputError

DEFAULT_SIZE = 100
DEFAULT_LENGTH = 1024
DEFAULT_SEED = 0
DISTRACTORS = 5
LENGTHS = (512, 1024, 2048, 4096)
"""The lengths the planted set is evaluated at (any length of at least :data:`MIN_LENGTH` works)."""
MIN_LENGTH = 128
CHARS_PER_TOKEN = 4.5
"""Characters per token when no tokenizer counts them (SmolLM2 on the movie snippets: 4.55)."""
SPLITS = {"train": 0, "test": 1}
SENTENCES = SourceSpec()
"""Each snippet line is cut into sentences as every text is (:func:`heedful.engine.sources.split_text`)."""

TEMPLATE = "The {subject} was {answer}."
QUESTION = "The {subject} was"

SUBJECTS: tuple[str, ...] = (
    "soundtrack", "cinematography", "costumes", "lighting", "editing", "casting", "makeup", "stunts",
    "narration", "wardrobe", "choreography", "trailer", "set design", "visual effects", "camera work",
    "opening scene", "sound design", "villain", "finale", "dialogue",
)
ANSWERS: tuple[str, ...] = (
    "excellent", "terrible", "superb", "awful", "brilliant", "average", "dreadful", "outstanding",
    "poor", "decent", "fantastic", "horrible", "wonderful", "boring", "stunning", "dull",
)


Counter = Callable[[Sequence[str]], np.ndarray]
"""``count(texts) -> [T]`` tokens of each text."""


def _counter(tokenizer: Any | None) -> tuple[Counter, Callable[[str], int]]:
    """How snippet lines and whole prompts are counted: with ``tokenizer`` (a line: its tokens
    without special tokens plus one for the line break; a prompt: every token the tokenizer
    gives it) or by the characters-per-token estimate."""
    if tokenizer is None:
        def lines(texts: Sequence[str]) -> np.ndarray:
            return np.array([math.ceil((len(t) + 1) / CHARS_PER_TOKEN) for t in texts], dtype=np.int64)

        return lines, lambda text: math.ceil(len(text) / CHARS_PER_TOKEN)
    if not callable(tokenizer):
        raise InputError(f"tokenizer must be a tokenizer (e.g. model.adapter.tokenizer), got {type(tokenizer).__name__}")

    def counted(texts: Sequence[str]) -> np.ndarray:
        ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return np.array([len(i) + 1 for i in ids], dtype=np.int64)

    return counted, lambda text: len(tokenizer(text)["input_ids"])


def _mentions(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """For each subject, ``[T]`` bool: the snippet names it (whole words, any case)."""
    found = {}
    for subject in SUBJECTS:
        pattern = re.compile(r"\b" + re.escape(subject) + r"\b", re.IGNORECASE)
        found[subject] = np.array([pattern.search(t) is not None for t in texts], dtype=bool)
    return found


def _document(
    rng: np.random.Generator,
    ident: str,
    snippets: Sequence[str],
    line_tokens: np.ndarray,
    mentions: dict[str, np.ndarray],
    length: int,
    distractors: int,
    count: Callable[[str], int],
) -> Example:
    subjects = [SUBJECTS[i] for i in rng.choice(len(SUBJECTS), 1 + distractors, replace=False)]
    answer = int(rng.integers(len(ANSWERS)))
    others = [i for i in range(len(ANSWERS)) if i != answer]
    ratings = [ANSWERS[answer]] + [ANSWERS[i] for i in rng.choice(others, distractors, replace=distractors > len(others))]
    planted = [TEMPLATE.format(subject=s, answer=a) for s, a in zip(subjects, ratings, strict=True)]
    question = QUESTION.format(subject=subjects[0])
    slots = rng.random(len(planted))  # where each template sentence goes, as a fraction of the document
    free = ~np.any([mentions[s] for s in subjects], axis=0)
    order = rng.permutation(np.flatnonzero(free))
    budget = length - count("\n".join(planted) + SEPARATOR + question)
    taken = int(np.searchsorted(np.cumsum(line_tokens[order]), budget, side="right"))
    chosen = [snippets[i] for i in order[:taken]]
    while True:
        lines: list[tuple[str, int]] = [(t, -1) for t in chosen]  # (line, which template sentence or -1)
        for k in np.argsort(-slots, kind="stable"):  # latest place first, so earlier places stay put
            lines.insert(int(round(slots[k] * len(chosen))), (planted[k], int(k)))
        context = "\n".join(t for t, _ in lines)
        tokens = count(context + SEPARATOR + question)
        if tokens <= length or not chosen:
            break
        chosen = chosen[:-1]  # the joined text took more tokens than its lines one by one
    if tokens > length:
        raise InputError(
            f"length {length} cannot hold the planted sentences and the question ({tokens} tokens)",
            hint="use a longer length or fewer distractors",
        )
    sources: list[tuple[int, int]] = []
    answer_source = -1
    start = 0
    for line, which in lines:
        if which == 0:
            answer_source = len(sources)
        sources.extend((start + a, start + b) for a, b in split_text(line, SENTENCES))
        start += len(line) + 1
    return context_example(
        ident,
        context,
        question,
        " " + ratings[0],
        answer_source=answer_source,
        answer_span=sources[answer_source],
        sources=sources,
        meta={
            "subject": subjects[0],
            "answer": ratings[0],
            "distractors": [[s, a] for s, a in zip(subjects[1:], ratings[1:], strict=True)],
            "tokens": int(tokens),
            "length": int(length),
        },
    )


def generate(
    n: int = DEFAULT_SIZE,
    split: str = "test",
    *,
    length: int = DEFAULT_LENGTH,
    seed: int = DEFAULT_SEED,
    tokenizer: Any | None = None,
    distractors: int = DISTRACTORS,
) -> Dataset:
    """``n`` planted documents of at most ``length`` prompt tokens from the movie snippets of
    ``split`` (see the module docstring): counted with ``tokenizer`` when given, else
    estimated; ``distractors`` template sentences about other subjects besides the planted one.

    >>> data = generate(2, length=256)                           # doctest: +SKIP
    >>> ex = data[0]; ex.text[ex.evidence_spans[0][1] : ex.evidence_spans[0][2]]  # doctest: +SKIP
    'The soundtrack was superb.'
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"n must be a positive number of documents, got {n!r}")
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r} of the planted set", hint="choose 'train' or 'test'")
    if isinstance(length, bool) or not isinstance(length, int) or length < MIN_LENGTH:
        raise InputError(f"length must be a whole number of tokens of at least {MIN_LENGTH}, got {length!r}", hint="e.g. length=1024")
    if isinstance(distractors, bool) or not isinstance(distractors, int) or not 0 <= distractors < len(SUBJECTS):
        raise InputError(f"distractors must be a whole number from 0 to {len(SUBJECTS) - 1}, got {distractors!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be a whole number, got {seed!r}")
    snippets = vader.load_split("movies", split)["text"].tolist()
    lines, count = _counter(tokenizer)
    line_tokens = lines(snippets)
    mentions = _mentions(snippets)
    examples = [
        _document(np.random.default_rng([seed, SPLITS[split], i]), str(i), snippets, line_tokens, mentions, length, distractors, count)
        for i in range(n)
    ]
    counted = "counted with the model's tokenizer" if tokenizer is not None else f"estimated at {CHARS_PER_TOKEN} characters per token"
    return Dataset(
        name="planted",
        split=split,
        examples=examples,
        task="context",
        evidence_source="by construction (the planted answer sentence)",
        description=(
            f"planted long contexts: movie-review snippets ({split} split) with one planted answer sentence and "
            f"{distractors} distractors, at most {length} prompt tokens ({counted})"
        ),
    )
