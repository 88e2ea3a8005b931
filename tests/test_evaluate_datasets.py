"""Evaluation data: lexicon-derived evidence, agreement minimal pairs, user files, ``load``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny import wordpiece_tokenizer

from heedful import datasets
from heedful.datasets import agreement, evidence, user
from heedful.datasets.examples import Example
from heedful.errors import InputError

LEXICON = {"charming": 2.8, "dull": -1.7, "well": 1.1, ":)": 2.0, "no": -1.2, "good": 1.9}


# --------------------------------------------------------------------------- lexicon evidence
def test_lexicon_matches_threshold_punctuation_and_emoticons():
    found = evidence.lexicon_matches("Charming, but DULL... and well made :) no", LEXICON, 1.5)
    assert [(w, s, e) for w, s, e, _ in found] == [("Charming", 0, 8), ("DULL", 14, 18), (":)", 36, 38)]
    # the threshold is on |valence|: "well" (1.1) and "no" (-1.2) pass at 1.0
    words = [w for w, *_ in evidence.lexicon_matches("well , no", LEXICON, 1.0)]
    assert words == ["well", "no"]


def test_token_evidence_maps_spans_to_subword_tokens():
    tok = wordpiece_tokenizer()
    text = "a charming and often affecting journey"
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    offsets = [None if sp else tuple(o) for o, sp in zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)]
    words, spans = evidence.lexicon_evidence(text, {"charming": 2.8, "journey": 1.6}, 1.5)
    mask = evidence.token_evidence(offsets, [0] * len(offsets), spans)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    chosen = "".join(t.removeprefix("##") for t, m in zip(tokens, mask, strict=True) if m)
    assert words == ("charming", "journey")
    assert chosen == "charmingjourney"
    assert not mask[0] and not mask[-1]  # [CLS] / [SEP] never
    # a span of the second segment does not light up tokens of the first
    assert not evidence.token_evidence(offsets, [0] * len(offsets), [(1, 2, 10)]).any()


# --------------------------------------------------------------------------- agreement pairs
def test_agreement_pairs_are_deterministic_and_well_formed():
    a = agreement.generate(60, seed=3)
    b = agreement.generate(60, seed=3)
    assert [e.text for e in a] == [e.text for e in b]
    assert [e.text for e in a] != [e.text for e in agreement.generate(60, seed=4)]
    assert len({e.text for e in a}) == 60 and len({e.id for e in a}) == 60
    paradigms = [e.meta["paradigm"] for e in a]
    assert set(paradigms) == set(agreement.PARADIGMS)
    assert all(paradigms.count(p) == 10 for p in agreement.PARADIGMS)  # round-robin: balanced
    for e in a:
        start, end = e.target_span
        assert e.text[start:end] == e.target != e.foil
        assert [e.text[s:t] for _, s, t in e.evidence_spans] == list(e.evidence)
        assert e.masked("<mask>").count("<mask>") == 1
        assert e.label in ("singular", "plural")
    # prefixes are stable: a shorter request is a prefix of a longer one
    assert [e.text for e in agreement.generate(12, seed=3)] == [e.text for e in a[:12]]


def test_agreement_paradigm_contents():
    pairs = {e.meta["paradigm"]: e for e in agreement.generate(6, seed=0)}
    sv = pairs["sv_agreement_attractor"]
    assert " of the " in sv.text and sv.evidence_before_target
    dn = pairs["determiner_noun"]
    assert dn.target in ("this", "these", "that", "those") and not dn.evidence_before_target
    ana = pairs["anaphor_number"]
    assert {ana.target, ana.foil} & {"themselves"} and ana.evidence_before_target
    nad = pairs["noun_after_determiner"]
    assert nad.evidence[0] in ("this", "these", "that", "those") and nad.evidence_before_target


def test_agreement_splits_disjoint_causal_filter_and_errors():
    test = {e.text for e in agreement.generate(200, "test")}
    train = {e.text for e in agreement.generate(200, "train")}
    assert not test & train
    causal = agreement.generate(40, causal=True)
    assert all(e.evidence_before_target for e in causal)
    assert {e.meta["paradigm"] for e in causal} == {"sv_agreement", "sv_agreement_attractor", "anaphor_number", "noun_after_determiner"}
    with pytest.raises(InputError, match="paradigm"):
        agreement.generate(5, paradigms=["nope"])
    with pytest.raises(InputError, match="split"):
        agreement.generate(5, "dev")


# --------------------------------------------------------------------------- user files
def test_user_csv_labels_evidence_words_and_ids(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(
        "id,text,label,rating,evidence\n"
        "a,A dull and dull film,NEGATIVE,-1.5,dull\n"
        "b,\"Charming, truly\",1,2.0,charming|truly\n"
        "c,no evidence here,0,,\n",
        encoding="utf-8",
    )
    ds = datasets.load(str(path))
    assert ds.ids == ["a", "b", "c"] and ds.task == "sentiment"
    a, b, c = ds
    assert a.label == "NEGATIVE" and a.rating == -1.5
    assert a.evidence_spans == ((0, 2, 6), (0, 11, 15))
    assert b.label == 1 and [b.text[s:e] for _, s, e in b.evidence_spans] == ["Charming", "truly"]
    assert c.rating is None and c.evidence_spans == ()


def test_user_jsonl_spans_pairs_split_and_errors(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"text": "the plot is thin", "text_pair": "is it thin?", "label": 0, "evidence": ["thin"], "split": "test"},
        {"text": "great cast", "label": 1, "evidence": [[0, 5]], "split": "test"},
        {"text": "ignored", "label": 1, "split": "train"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    ds = datasets.load(str(path), "test")
    assert len(ds) == 2 and ds[0].text_pair == "is it thin?"
    assert ds[0].evidence_spans == ((0, 12, 16), (1, 6, 10))  # found in both segments
    assert ds[1].evidence == ("great",)
    bad = tmp_path / "bad.csv"
    bad.write_text("words\nhello\n", encoding="utf-8")
    with pytest.raises(InputError, match="no 'text' column"):
        datasets.load(str(bad))
    missing = tmp_path / "missing.csv"
    missing.write_text("text,evidence\nhello there,absent\n", encoding="utf-8")
    with pytest.raises(InputError, match="none of the evidence words"):
        datasets.load(str(missing))
    dup = tmp_path / "dup.csv"
    dup.write_text("id,text\n1,a\n1,b\n", encoding="utf-8")
    with pytest.raises(InputError, match="twice"):
        datasets.load(str(dup))


def test_load_dispatch_and_round_trip(tmp_path):
    with pytest.raises(InputError, match="unknown dataset"):
        datasets.load("sst2")
    with pytest.raises(InputError, match="takes no option"):
        datasets.load("agreement", n=3, threshold=2)
    pairs = datasets.load("agreement", "test", n=7)
    assert len(pairs) == 7 and pairs.evidence_source.endswith("not BLiMP)")
    out = tmp_path / "pairs.jsonl"
    pairs.to_jsonl(str(out))
    back = datasets.load(str(out))
    assert [Example.from_dict(e.to_dict()) for e in pairs] == list(pairs)
    assert [e.text for e in back] == [e.text for e in pairs]
    assert [e.target for e in back] == [e.target for e in pairs]


def test_snippet_sets_get_lexicon_evidence():
    if not (datasets.vader.data_dir() / "vader_lexicon.txt").is_file():
        pytest.skip("VADER data not downloaded")
    ds = datasets.load("movies", "test", n=20)
    assert len(ds) == 20 and ds.label_names == ("NEGATIVE", "POSITIVE")
    assert ds.evidence_source.startswith("lexicon-derived")
    assert [e.id for e in ds] == datasets.load_split("movies", "test")["id"].head(20).tolist()
    lexicon = datasets.vader_lexicon()
    for e in ds:
        assert e.label == int(e.rating > 0)
        for word in e.evidence:
            assert abs(lexicon[word.lower()]) >= evidence.DEFAULT_THRESHOLD
    assert np.mean([bool(e.evidence) for e in ds]) > 0.5
    strict = datasets.load("movies", "test", n=20, threshold=3.0)
    assert sum(len(e.evidence) for e in strict) < sum(len(e.evidence) for e in ds)


def test_user_looks_like_path():
    assert user.looks_like_path("data/x.csv") and user.looks_like_path("x.jsonl")
    assert not user.looks_like_path("movies")
