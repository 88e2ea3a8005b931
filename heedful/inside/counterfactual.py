"""Counterfactual tests of explanations (Ye, Nair and Durrett 2021, "Connecting Attributions and
QA Model Behavior on Realistic Counterfactuals"): turn an explanation into a hypothesis about
the model and test it on realistic edits of the input.

The hypothesis of an explanation of a classifier's prediction ``c`` for a text is *"its top-k
words drive the prediction"*. Three realistic edits test it, each against a control edit of the
same kind on words the explanation did not rank on top (drawn at random, seeded):

``replace``
    the top-k content words (adjectives, nouns, verbs, adverbs) are replaced by other words of
    the same fine part-of-speech tag (spaCy's ``tag_``: ``JJ``, ``NNS``, ``VBD`` ...) from the
    corpus. Predicted: ``p(c)`` drops more than when k other content words are replaced the
    same way. Confirmed when ``drop(top) > drop(control) + margin`` (``margin`` 0.05 by
    default: two edits that both leave the prediction alone confirm nothing).
``negate``
    ``not`` is put before the highest-scoring adjective (``a not charming journey``; a finite
    verb would need ``do``-support). Predicted: ``p(c)`` drops more than when another adjective
    is negated. Confirmed when ``drop(top) > drop(control) + margin``.
``swap``
    the two highest-scoring content words trade places. Predicted: the words, not where they
    stand, drive the prediction, so ``c`` stays predicted. Confirmed when it does.

A method's *confirmation rate* per edit -- the share of its hypotheses the model's behaviour
bears out, with a 95 % Wilson interval -- says how useful its explanations are for predicting
what the model does on inputs people would write, beyond deletion curves (AOPC), whose
inputs with words dropped are not such inputs. An explanation no better than a random ranking
of the words confirms ``replace`` and ``negate`` no more often than its control edits outdo
them by the margin.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from heedful.errors import InputError
from heedful.evaluate.intervals import bootstrap_mean, wilson
from heedful.progress import task

if TYPE_CHECKING:
    import pandas as pd

    from heedful.explanation import Explanation
    from heedful.model import Model

EDITS: tuple[str, ...] = ("replace", "negate", "swap")
CONTENT: frozenset[str] = frozenset({"ADJ", "NOUN", "VERB", "ADV"})
"""Universal part-of-speech tags of the words an edit may touch."""
NEGATABLE: frozenset[str] = frozenset({"ADJ"})


@dataclass(frozen=True)
class Word:
    """A word of a text: characters ``[start, end)``, its universal ``pos`` and fine ``tag``."""

    start: int
    end: int
    text: str
    pos: str
    tag: str


Tagger = Callable[[Sequence[str]], list[list[Word]]]
"""``tagger(texts) -> words of each text`` (default: spaCy's ``en_core_web_sm``, :func:`spacy_tagger`)."""


def spacy_tagger(texts: Sequence[str]) -> list[list[Word]]:
    """Words of each text with spaCy's part-of-speech tags (the pinned ``en_core_web_sm``
    pipeline heedful fetches for Mask-LRP, :func:`heedful.lrp.heads.load_parser`)."""
    from heedful.lrp.heads import load_parser

    nlp = load_parser()
    return [[Word(t.idx, t.idx + len(t.text), t.text, t.pos_, t.tag_) for t in doc] for doc in nlp.pipe(list(texts))]


def vocabulary(tagged: Sequence[Sequence[Word]]) -> dict[str, list[str]]:
    """Content words of the corpus by fine tag (lower-cased, sorted, each once): the pool a
    ``replace`` edit draws from."""
    pool: dict[str, set[str]] = {}
    for words in tagged:
        for w in words:
            if w.pos in CONTENT and w.text.isalpha():
                pool.setdefault(w.tag, set()).add(w.text.lower())
    return {tag: sorted(found) for tag, found in pool.items()}


def tagger_name(tagger: Tagger) -> str:
    """What tags the words, for keys of stored results: spaCy's pipeline with its version, or
    the function's qualified name."""
    if tagger is spacy_tagger:
        from heedful.lrp.heads import PARSER_PIN

        return f"spacy {PARSER_PIN.requirement}"
    return f"{tagger.__module__}.{tagger.__qualname__}"


def word_scores(expl: Explanation, words: Sequence[Word]) -> np.ndarray:
    """``[W]``: each word's score, the sum of the scores of the tokens that start inside it."""
    scores = np.asarray(expl.scores[-1] if expl.scores.ndim == 2 else expl.scores, dtype=float)
    starts = np.array([w.start for w in words])
    ends = np.array([w.end for w in words])
    found = np.zeros(len(words))
    for i, offset in enumerate(expl.offsets):
        if offset is None or expl.special[i] or expl.segments[i] not in (0, None):
            continue
        inside = np.flatnonzero((starts <= offset[0]) & (offset[0] < ends))
        if inside.size:
            found[inside[0]] += scores[i]
    return found


def edited(text: str, changes: Sequence[tuple[Word, str]]) -> str:
    """``text`` with each word's characters replaced by its new text (changes may come in any order)."""
    for word, new in sorted(changes, key=lambda c: -c[0].start):
        text = text[: word.start] + new + text[word.end :]
    return text


def _cased(like: str, word: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _replacements(words: Sequence[Word], pool: dict[str, list[str]], rng: np.random.Generator) -> list[tuple[Word, str]] | None:
    changes = []
    for w in words:
        options = [o for o in pool.get(w.tag, []) if o != w.text.lower()]
        if not options:
            return None
        changes.append((w, _cased(w.text, options[int(rng.integers(len(options)))])))
    return changes


def _negation(word: Word) -> tuple[Word, str]:
    return word, "not " + word.text


@dataclass
class Hypothesis:
    """One hypothesis tested: ``method``'s explanation of text ``index`` under ``edit``.

    ``top`` / ``control``: the words edited and the control words; ``texts``: the edited text and
    the control text (``swap``: no control); ``drop`` / ``control_drop``: the fall of ``p(c)``,
    ``c`` the original prediction; ``kept``: ``c`` still predicted after the edit;
    ``confirmed``: the behaviour the hypothesis predicts was seen."""

    index: int
    method: str
    edit: str
    top: list[str]
    control: list[str]
    texts: tuple[str, ...]
    drop: float = math.nan
    control_drop: float = math.nan
    kept: bool = True
    confirmed: bool = False


def hypotheses(
    index: int, method: str, text: str, words: list[Word], scores: np.ndarray, pool: dict[str, list[str]], k: int, edits: Sequence[str], seed: int,
    number: int | None = None,
) -> list[Hypothesis]:
    """The hypotheses of one explanation (``scores`` ``[W]`` over ``words``) of text ``index``,
    one per edit that the text allows (enough content words, a replacement of the same tag);
    the control draws are seeded with ``(seed, number)`` (default ``number = index``)."""
    content = [i for i, w in enumerate(words) if w.pos in CONTENT and w.text.isalpha()]
    ranked = sorted(content, key=lambda i: (-scores[i], i))
    found = []
    # the control draws depend on the text and the seed only, so methods ranking alike edit alike
    rng = np.random.default_rng([seed, index if number is None else number])
    if "replace" in edits and len(ranked) >= 2 * k:
        top = [words[i] for i in ranked[:k]]
        rest = ranked[k:]
        control = [words[i] for i in sorted(rng.choice(rest, size=k, replace=False).tolist())]
        changes, controls = _replacements(top, pool, rng), _replacements(control, pool, rng)
        if changes is not None and controls is not None:
            found.append(Hypothesis(index, method, "replace", [w.text for w in top], [w.text for w in control], (edited(text, changes), edited(text, controls))))
    negatable = [i for i in ranked if words[i].pos in NEGATABLE]
    if "negate" in edits and len(negatable) >= 2:
        top, other = words[negatable[0]], words[int(rng.choice(negatable[1:]))]
        found.append(Hypothesis(index, method, "negate", [top.text], [other.text], (edited(text, [_negation(top)]), edited(text, [_negation(other)]))))
    if "swap" in edits and len(ranked) >= 2:
        a, b = words[ranked[0]], words[ranked[1]]
        if a.text.lower() != b.text.lower():
            found.append(Hypothesis(index, method, "swap", [a.text, b.text], [], (edited(text, [(a, b.text), (b, a.text)]),)))
    return found


def class_probabilities(model: Model, texts: Sequence[str], batch_size: int = 32) -> torch.Tensor:
    """``[T, C]`` the classifier's class probabilities for ``texts``."""
    adapter = model.adapter
    found = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = adapter.encode(texts[start : start + batch_size])
            anchor = adapter.anchor_positions(batch)[0]
            found.append(adapter.forward(batch, anchor).logits.float().softmax(-1).cpu())
    return torch.cat(found)


@dataclass
class CounterfactualReport:
    """Every hypothesis tested (:class:`Hypothesis`), and per method and edit the share
    confirmed (:meth:`summary`)."""

    hypotheses: list[Hypothesis]
    methods: list[str]
    k: int
    texts: int
    options: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """Per method and edit: ``n`` hypotheses, ``confirmed``, ``share`` with its 95 % Wilson
        interval (``low``, ``high``), and the mean of ``drop - control_drop`` with its 95 %
        bootstrap interval (``replace`` and ``negate``)."""
        import pandas as pd

        rows = []
        for method in self.methods:
            for edit in EDITS:
                mine = [h for h in self.hypotheses if h.method == method and h.edit == edit]
                if not mine:
                    continue
                confirmed = sum(h.confirmed for h in mine)
                low, high = wilson(confirmed, len(mine))
                gap = np.array([h.drop - h.control_drop for h in mine], dtype=float)
                mean, gap_low, gap_high = bootstrap_mean(gap[np.isfinite(gap)]) if edit != "swap" else (math.nan,) * 3
                rows.append({
                    "method": method, "edit": edit, "n": len(mine), "confirmed": confirmed, "share": confirmed / len(mine),
                    "low": low, "high": high, "gap": mean, "gap_low": gap_low, "gap_high": gap_high,
                })
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "methods": self.methods, "k": self.k, "texts": self.texts, "options": self.options,
            "summary": self.summary().to_dict(orient="records"),
            "hypotheses": [h.__dict__ for h in self.hypotheses],
        }

    def table(self):
        """The summary as a rich table."""
        from rich.table import Table

        table = Table(title=f"Counterfactual tests of the top-{self.k} words ({self.texts} texts)", title_justify="left")
        for name, justify in (("method", "left"), ("edit", "left"), ("n", "right"), ("confirmed", "right"), ("drop(top) - drop(control)", "right")):
            table.add_column(name, justify=justify)
        for row in self.summary().itertuples():
            gap = "" if not math.isfinite(row.gap) else f"{row.gap:+.3f} [{row.gap_low:+.3f}, {row.gap_high:+.3f}]"
            table.add_row(row.method, row.edit, str(row.n), f"{row.share:.2f} [{row.low:.2f}, {row.high:.2f}]", gap)
        return table


def check_test(k: int, edits: Sequence[str], margin: float) -> None:
    """Refuse, in one line and before any work, options :func:`counterfactual_test` cannot take."""
    unknown = [e for e in edits if e not in EDITS]
    if unknown:
        raise InputError(f"unknown edit {unknown[0]!r}", hint=f"one of {', '.join(EDITS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}", hint="k=1 tests the top word")
    if not (isinstance(margin, int | float) and math.isfinite(margin) and 0 <= margin < 1):
        raise InputError(f"margin must be a probability difference in [0, 1), got {margin!r}", hint="the default is 0.05")


def counterfactual_test(
    model: Model,
    texts: Sequence[str],
    methods: Sequence[str],
    *,
    k: int = 1,
    edits: Sequence[str] = EDITS,
    seed: int = 0,
    tagger: Tagger | None = None,
    corpus: Sequence[str] | None = None,
    method_options: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 16,
    margin: float = 0.05,
) -> CounterfactualReport:
    """Test each method's explanations of ``model``'s predictions on ``texts`` on realistic
    counterfactuals (see the module docstring).

    ``k``: words the hypothesis names (``replace``); ``edits``: a subset of :data:`EDITS`;
    ``tagger``: part-of-speech tagger (default spaCy's); ``corpus``: texts whose words the
    replacements are drawn from (default ``texts``); ``method_options``: options per method;
    ``margin``: how much more the top words' edit must lower ``p(c)`` than the control's."""
    check_test(k, edits, margin)
    _check_classifier(model)
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts or not methods:
        raise InputError("no texts or no methods to test", hint="give at least one text and one method")
    for name in methods:
        model.method(name)  # a misspelt method is refused before any work
    tagger = tagger or spacy_tagger
    tagged = tagger(texts)
    pool = vocabulary(tagged if corpus is None else tagger(corpus))
    explained: dict[str, list[Explanation]] = {}
    with task("explaining", len(methods)) as progress:
        for name in methods:
            explained[name] = model.explain(list(texts), method=name, batch_size=batch_size, **(method_options or {}).get(name, {}))
            progress.advance()
    return counterfactual_report(model, texts, explained, tagged, pool, k=k, edits=edits, seed=seed, batch_size=batch_size, margin=margin)


def _check_classifier(model: Model) -> None:
    if model.task != "classification":
        raise InputError(f"counterfactual tests read a classifier's prediction; {model.name} is a {model.task} model", hint="use a classifier, e.g. minilm-sentiment")


def counterfactual_report(
    model: Model,
    texts: Sequence[str],
    explained: dict[str, Sequence[Explanation]],
    tagged: Sequence[Sequence[Word]],
    pool: dict[str, list[str]],
    *,
    k: int = 1,
    edits: Sequence[str] = EDITS,
    seed: int = 0,
    batch_size: int = 16,
    margin: float = 0.05,
    numbers: Sequence[int] | None = None,
) -> CounterfactualReport:
    """Test explanations already computed: ``explained[method][i]`` explains ``model``'s
    prediction on ``texts[i]``, whose words are ``tagged[i]``; replacements are drawn from
    ``pool`` (:func:`vocabulary`). The hypotheses of text ``i`` draw their control words from
    ``(seed, numbers[i])`` alone (default ``numbers[i] = i``), so a method ranking alike edits
    alike, and a text tested apart from its corpus (``numbers``: its place there) is edited as
    it would be with it. :func:`counterfactual_test` is this after explaining."""
    check_test(k, edits, margin)
    _check_classifier(model)
    numbers = list(range(len(texts))) if numbers is None else list(numbers)
    found: list[Hypothesis] = []
    for name, explanations in explained.items():
        for i, (text, words, expl) in enumerate(zip(texts, tagged, explanations, strict=True)):
            found += hypotheses(i, name, text, words, word_scores(expl, words), pool, k, edits, seed, numbers[i])
    original = class_probabilities(model, texts, batch_size)
    predicted = original.argmax(-1)
    edited_texts = [t for h in found for t in h.texts]
    probs = class_probabilities(model, edited_texts, batch_size) if edited_texts else torch.zeros(0, original.shape[1])
    at = 0
    for h in found:
        c = int(predicted[h.index])
        before = float(original[h.index, c])
        rows = probs[at : at + len(h.texts)]
        at += len(h.texts)
        h.drop = before - float(rows[0, c])
        h.kept = int(rows[0].argmax()) == c
        if h.edit == "swap":
            h.confirmed = h.kept
        else:
            h.control_drop = before - float(rows[1, c])
            h.confirmed = h.drop > h.control_drop + margin
    return CounterfactualReport(found, list(explained), k, len(texts), {"edits": list(edits), "seed": seed, "margin": margin})


_WORD = re.compile(r"[A-Za-z]+")


def regex_tagger(tags: dict[str, tuple[str, str]]) -> Tagger:
    """A tagger from a word list, ``{word: (pos, tag)}`` (words not listed are ``X``): for tests
    and for languages spaCy's English pipeline does not tag."""

    def tag(texts: Sequence[str]) -> list[list[Word]]:
        return [
            [Word(m.start(), m.end(), m.group(), *tags.get(m.group().lower(), ("X", "XX"))) for m in _WORD.finditer(text)]
            for text in texts
        ]

    return tag
