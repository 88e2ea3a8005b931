"""Agreement minimal pairs with known evidence, generated here from a seed.

**This is not BLiMP.** It follows the paradigms of BLiMP (Warstadt et al. 2020, *BLiMP: The
Benchmark of Linguistic Minimal Pairs for English*) that the NormXLogit paper (Experiment 2,
Table 2; after Mohebbi et al. 2023) uses for evidence alignment, but every sentence is generated
by this module from a small hand-written vocabulary and a seed. BLiMP itself is not shipped with
any package available here. Results on these pairs are comparable in kind, not in number, to
results on BLiMP.

Each pair is one :class:`~heedful.datasets.Example`: ``text`` is the grammatical sentence,
``target`` the word at ``target_span`` that makes it grammatical, ``foil`` the word that makes
it ungrammatical, and ``evidence`` / ``evidence_spans`` the word(s) that decide between them --
known by construction, so no parser or coreference system is needed (the paper uses spaCy and
NeuralCoref to find them in BLiMP).

=============================  =====  =========================================================
paradigm                       BLiMP  example (target / foil, [evidence])
=============================  =====  =========================================================
``sv_agreement``               rpsv   The [pedestrian] has / have forgotten the answer.
``sv_agreement_attractor``     darn   The [sister] of the doctors writes / write a letter.
``determiner_noun``            dna    Russell explored this / these [mall].
``determiner_noun_adjective``  dnaa   Patients scan this / these orange [brochure].
``anaphor_number``             ana    The [government] alarms itself / themselves.
``noun_after_determiner``      (dna)  Russell explored [these] malls / mall.
=============================  =====  =========================================================

In ``determiner_noun`` and ``determiner_noun_adjective`` the evidence comes *after* the target
(the NormXLogit / Value Zeroing reformulation for masked LMs); ``noun_after_determiner`` is
BLiMP's own direction (the noun varies, the determiner is the evidence) and, like the
subject-verb and anaphor paradigms, works for causal LMs (``Example.evidence_before_target``).

Splits: ``"test"`` is drawn from ``numpy.random.default_rng([seed, 1])`` and ``"train"`` from
``default_rng([seed, 0])`` with the first ``max(n, 1000)`` test sentences excluded, so a train set
never shares a sentence with a test set of that size. Any prefix of a split is the same whatever
``n`` is asked for.
Paradigms are interleaved round-robin, so any prefix of a split is balanced across paradigms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from heedful.datasets.examples import Dataset, Example
from heedful.errors import InputError

DEFAULT_SIZE = 1000
DEFAULT_SEED = 0

# (singular, plural, gender of the singular: "m", "f" or None)
PEOPLE: list[tuple[str, str, str | None]] = [
    ("sister", "sisters", "f"), ("brother", "brothers", "m"), ("doctor", "doctors", None),
    ("teacher", "teachers", None), ("student", "students", None), ("pedestrian", "pedestrians", None),
    ("actress", "actresses", "f"), ("actor", "actors", "m"), ("king", "kings", "m"),
    ("queen", "queens", "f"), ("man", "men", "m"), ("woman", "women", "f"), ("child", "children", None),
    ("girl", "girls", "f"), ("boy", "boys", "m"), ("nurse", "nurses", None), ("lawyer", "lawyers", None),
    ("farmer", "farmers", None), ("author", "authors", None), ("senator", "senators", None),
    ("customer", "customers", None), ("patient", "patients", None), ("guest", "guests", None),
    ("dancer", "dancers", None), ("manager", "managers", None), ("driver", "drivers", None),
    ("uncle", "uncles", "m"), ("aunt", "aunts", "f"), ("niece", "nieces", "f"), ("nephew", "nephews", "m"),
]
THINGS: list[tuple[str, str]] = [
    ("mall", "malls"), ("brochure", "brochures"), ("book", "books"), ("car", "cars"), ("house", "houses"),
    ("picture", "pictures"), ("window", "windows"), ("computer", "computers"), ("river", "rivers"),
    ("movie", "movies"), ("school", "schools"), ("museum", "museums"), ("chair", "chairs"),
    ("table", "tables"), ("bicycle", "bicycles"), ("restaurant", "restaurants"), ("report", "reports"),
    ("song", "songs"), ("letter", "letters"), ("photograph", "photographs"), ("glass", "glasses"),
    ("dish", "dishes"), ("box", "boxes"), ("church", "churches"), ("lake", "lakes"),
    ("mountain", "mountains"), ("library", "libraries"), ("city", "cities"), ("story", "stories"),
    ("painting", "paintings"), ("shirt", "shirts"), ("cake", "cakes"), ("apple", "apples"),
]
ORGANISATIONS: list[tuple[str, str]] = [
    ("government", "governments"), ("company", "companies"), ("committee", "committees"),
    ("university", "universities"), ("hospital", "hospitals"), ("team", "teams"), ("school", "schools"),
    ("museum", "museums"), ("library", "libraries"), ("bank", "banks"), ("newspaper", "newspapers"),
    ("council", "councils"), ("club", "clubs"), ("band", "bands"), ("city", "cities"),
]
# (third person singular, plural / base form, continuation)
VERBS: list[tuple[str, str, str]] = [
    ("writes", "write", "a letter"), ("has", "have", "forgotten the answer"), ("is", "are", "here"),
    ("was", "were", "late"), ("likes", "like", "the movie"), ("sees", "see", "the mountain"),
    ("knows", "know", "the answer"), ("wants", "want", "a book"), ("needs", "need", "help"),
    ("visits", "visit", "the museum"), ("watches", "watch", "the game"), ("finds", "find", "the box"),
    ("remembers", "remember", "the song"), ("plays", "play", "the piano"), ("does", "do", "the work"),
    ("goes", "go", "home"), ("makes", "make", "dinner"), ("takes", "take", "the bus"),
    ("loves", "love", "the city"), ("hates", "hate", "the rain"), ("cleans", "clean", "the house"),
    ("drives", "drive", "the car"), ("sings", "sing", "every morning"), ("works", "work", "downtown"),
]
REFLEXIVE_VERBS = [
    "alarms", "praises", "protects", "criticizes", "describes", "embarrasses", "questions",
    "reorganizes", "defends", "funds", "promotes", "surprises",
]
PERSON_REFLEXIVE_VERBS = [
    "hurt", "praised", "saw", "described", "helped", "questioned", "admired", "blamed", "surprised",
    "fooled", "trusted", "forgot",
]
NAMES = [
    "Russell", "Grace", "Craig", "Susan", "Raymond", "Patricia", "Diana", "Carlos", "Tina", "Bill",
    "Laura", "Martin", "Elaine", "Kevin", "Nancy", "Dennis", "Monica", "Todd", "Sheila", "Omar",
]
PAST_VERBS = [
    "explored", "visited", "saw", "liked", "found", "painted", "cleaned", "bought", "sold",
    "described", "noticed", "left", "photographed", "admired", "remembered", "fixed",
]
ADJECTIVES = [
    "orange", "old", "big", "small", "red", "new", "beautiful", "expensive", "wooden", "quiet",
    "green", "famous", "strange", "tiny", "dirty", "clean",
]
DETERMINERS = [("this", "these"), ("that", "those")]

BLIMP_UIDS = {
    "sv_agreement": "regular_plural_subject_verb_agreement_1 (rpsv)",
    "sv_agreement_attractor": "distractor_agreement_relational_noun (darn)",
    "determiner_noun": "determiner_noun_agreement_1 (dna), determiner as target",
    "determiner_noun_adjective": "determiner_noun_agreement_with_adjective_1 (dnaa), determiner as target",
    "anaphor_number": "anaphor_number_agreement (ana)",
    "noun_after_determiner": "determiner_noun_agreement_1 (dna), BLiMP's direction",
}
PARADIGMS: tuple[str, ...] = tuple(BLIMP_UIDS)


@dataclass(frozen=True)
class _Piece:
    """A word of a sentence under construction and its role."""

    text: str
    role: str = ""  # "", "target", "evidence"


def _assemble(pieces: Sequence[_Piece], end: str = ".") -> tuple[str, tuple[int, int], list[tuple[str, int, int]]]:
    """Join pieces with spaces; return the sentence, the target span and the evidence spans."""
    text, target, evidence = "", (0, 0), []
    for piece in pieces:
        if text:
            text += " "
        start = len(text)
        text += piece.text
        if piece.role == "target":
            target = (start, len(text))
        elif piece.role == "evidence":
            evidence.append((piece.text, start, len(text)))
    return text + end, target, evidence


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


def _cap(word: str) -> str:
    return word[:1].upper() + word[1:]


Built = tuple[list[_Piece], str, str, bool]
"""Pieces of the grammatical sentence, target word, foil word, whether the target is plural."""


def _sv(rng: np.random.Generator, attractor: bool) -> Built:
    plural = bool(rng.integers(2))
    sg, pl, _ = _pick(rng, PEOPLE)
    verb_sg, verb_pl, rest = _pick(rng, VERBS)
    head = pl if plural else sg
    pieces = [_Piece("The"), _Piece(head, "evidence")]
    if attractor:
        # a relational attractor ("the sister of the doctors") of the opposite number
        a_sg, a_pl, _ = _pick(rng, PEOPLE)
        while a_sg == sg:
            a_sg, a_pl, _ = _pick(rng, PEOPLE)
        pieces += [_Piece("of"), _Piece("the"), _Piece(a_sg if plural else a_pl)]
    target, foil = (verb_pl, verb_sg) if plural else (verb_sg, verb_pl)
    pieces += [_Piece(target, "target"), *(_Piece(w) for w in rest.split())]
    return pieces, target, foil, plural


def _determiner_noun(rng: np.random.Generator, adjective: bool, noun_is_target: bool) -> Built:
    plural = bool(rng.integers(2))
    sg, pl = _pick(rng, THINGS)
    det_sg, det_pl = _pick(rng, DETERMINERS)
    noun, other_noun = (pl, sg) if plural else (sg, pl)
    det, other_det = (det_pl, det_sg) if plural else (det_sg, det_pl)
    pieces = [_Piece(_pick(rng, NAMES)), _Piece(_pick(rng, PAST_VERBS))]
    if noun_is_target:
        pieces += [_Piece(det, "evidence"), _Piece(noun, "target")]
        return pieces, noun, other_noun, plural
    pieces.append(_Piece(det, "target"))
    if adjective:
        pieces.append(_Piece(_pick(rng, ADJECTIVES)))
    pieces.append(_Piece(noun, "evidence"))
    return pieces, det, other_det, plural


ADVERBIALS = ["", "again", "today", "yesterday", "often", "in public"]


def _anaphor(rng: np.random.Generator) -> Built:
    plural = bool(rng.integers(2))
    if rng.integers(2):
        sg, pl = _pick(rng, ORGANISATIONS)
        singular_reflexive = "itself"
        verb = _pick(rng, REFLEXIVE_VERBS)
        if plural:
            verb = _plural_present(verb)
    else:
        gendered = [p for p in PEOPLE if p[2] is not None]
        sg, pl, gender = _pick(rng, gendered)
        singular_reflexive = "herself" if gender == "f" else "himself"
        verb = _pick(rng, PERSON_REFLEXIVE_VERBS)  # past tense: no agreement on the verb
    noun = pl if plural else sg
    target, foil = ("themselves", singular_reflexive) if plural else (singular_reflexive, "themselves")
    pieces = [_Piece("The"), _Piece(noun, "evidence"), _Piece(verb), _Piece(target, "target")]
    pieces += [_Piece(w) for w in _pick(rng, ADVERBIALS).split()]
    return pieces, target, foil, plural


def _plural_present(verb: str) -> str:
    """Base form of a regular third-person-singular verb (``criticizes`` -> ``criticize``)."""
    if verb.endswith(("sses", "shes", "ches", "xes")):
        return verb[:-2]
    return verb[:-1]


_BUILDERS: dict[str, Callable[[np.random.Generator], Built]] = {
    "sv_agreement": lambda rng: _sv(rng, attractor=False),
    "sv_agreement_attractor": lambda rng: _sv(rng, attractor=True),
    "determiner_noun": lambda rng: _determiner_noun(rng, adjective=False, noun_is_target=False),
    "determiner_noun_adjective": lambda rng: _determiner_noun(rng, adjective=True, noun_is_target=False),
    "anaphor_number": _anaphor,
    "noun_after_determiner": lambda rng: _determiner_noun(rng, adjective=False, noun_is_target=True),
}


def _check_paradigms(paradigms: Sequence[str] | None) -> tuple[str, ...]:
    chosen = tuple(paradigms) if paradigms else PARADIGMS
    unknown = [p for p in chosen if p not in _BUILDERS]
    if unknown:
        raise InputError(f"unknown agreement paradigm {unknown[0]!r}", hint=f"choose from: {', '.join(PARADIGMS)}")
    return chosen


def _pairs(
    rng: np.random.Generator, paradigms: tuple[str, ...], n: int, split: str, exclude: set[str]
) -> list[Example]:
    found: list[Example] = []
    seen = set(exclude)
    counts = dict.fromkeys(paradigms, 0)
    attempts = 0
    while len(found) < n:
        paradigm = paradigms[len(found) % len(paradigms)]
        pieces, target, foil, plural = _BUILDERS[paradigm](rng)
        pieces[0] = _Piece(_cap(pieces[0].text), pieces[0].role)
        text, span, evidence = _assemble(pieces)
        attempts += 1
        if text in seen:
            if attempts > 50 * n + 1000:
                raise InputError(
                    f"could not generate {n} distinct agreement pairs",
                    hint="ask for fewer pairs or fewer paradigms excluded",
                )
            continue
        seen.add(text)
        counts[paradigm] += 1
        found.append(
            Example(
                id=f"{paradigm}-{counts[paradigm]:05d}",
                text=text,
                label="plural" if plural else "singular",
                evidence=tuple(w for w, _, _ in evidence),
                evidence_spans=tuple((0, s, e) for _, s, e in evidence),
                target=target,
                foil=foil,
                target_span=span,
                meta={"paradigm": paradigm, "blimp": BLIMP_UIDS[paradigm], "split": split},
            )
        )
    return found




def generate(
    n: int = DEFAULT_SIZE,
    split: str = "test",
    seed: int = DEFAULT_SEED,
    paradigms: Sequence[str] | None = None,
    causal: bool = False,
) -> Dataset:
    """``n`` agreement minimal pairs of the given split, deterministic from ``seed``.

    ``paradigms`` restricts the paradigms (default: all of :data:`PARADIGMS`); ``causal=True``
    keeps only those whose evidence precedes the target (usable by causal LMs, which see only the
    prefix). ``label`` is the grammatical number of the target word ("singular" / "plural").

    >>> pairs = generate(4, seed=0)
    >>> [e.meta["paradigm"] for e in pairs][:2]
    ['sv_agreement', 'sv_agreement_attractor']
    """
    if n < 1:
        raise InputError(f"n must be positive, got {n}")
    if split not in ("train", "test"):
        raise InputError(f"unknown split {split!r}", hint="choose 'train' or 'test'")
    chosen = _check_paradigms(paradigms)
    if causal:
        chosen = tuple(p for p in chosen if p not in ("determiner_noun", "determiner_noun_adjective"))
        if not chosen:
            raise InputError("no causal-compatible paradigm selected", hint="add sv_agreement, anaphor_number or noun_after_determiner")
    if split == "test":
        examples = _pairs(np.random.default_rng([seed, 1]), chosen, n, "test", set())
    else:
        # test pairs are a prefix-stable sequence: excluding the first max(n, DEFAULT_SIZE) of them
        # keeps train disjoint from any test set of that size or smaller
        test = _pairs(np.random.default_rng([seed, 1]), chosen, max(n, DEFAULT_SIZE), "test", set())
        examples = _pairs(np.random.default_rng([seed, 0]), chosen, n, "train", {e.text for e in test})
    return Dataset(
        name="agreement",
        split=split,
        examples=examples,
        task="agreement",
        label_names=("singular", "plural"),
        evidence_source="by construction (generated minimal pairs following BLiMP's paradigms; not BLiMP)",
        description="agreement minimal pairs generated by heedful following BLiMP paradigms (not BLiMP)",
    )
