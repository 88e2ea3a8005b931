"""Counterfactual tests of explanations (heedful.inside.counterfactual) on a planted tiny model:
a tiny BERT classifier trained here, in seconds, to predict POSITIVE exactly when "wonderful"
is in the text. An explanation ranking "wonderful" first makes a hypothesis the model bears
out under every replacement; one ranking it last does not."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import heedful
from heedful.evaluate.intervals import wilson
from heedful.inside.counterfactual import (
    Word,
    counterfactual_test,
    edited,
    hypotheses,
    regex_tagger,
    vocabulary,
)
from heedful.testing import tiny_hf

ADJECTIVES = ["dull", "long", "predictable", "funny", "charming", "moving", "intelligent", "wonderful"]
NOUNS = ["movie", "plot", "film", "cast", "journey"]
TAGS = {**{a: ("ADJ", "JJ") for a in ADJECTIVES}, **{n: ("NOUN", "NN") for n in NOUNS}, "was": ("AUX", "VBD"), "the": ("DET", "DT"), "and": ("CCONJ", "CC")}
PLANTED = "wonderful"


def _sentences() -> list[str]:
    return [f"the {n1} was {a} and the {n2} was {b}" for n1, n2 in itertools.product(NOUNS[:3], NOUNS[2:]) for a, b in itertools.product(ADJECTIVES, ADJECTIVES) if a != b]


@pytest.fixture(scope="module")
def planted():
    """The tiny BERT classifier trained to predict POSITIVE (2) iff PLANTED occurs, else NEGATIVE (0)."""
    hf, tok = tiny_hf("bert", "classification", seed=0)
    texts = _sentences()
    labels = torch.tensor([2 if PLANTED in t.split() else 0 for t in texts])
    enc = tok(texts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    hf.train()
    optimiser = torch.optim.Adam(hf.parameters(), lr=3e-3)
    for _ in range(150):
        rows = torch.randint(len(texts), (64,))
        loss = hf(input_ids=enc["input_ids"][rows], attention_mask=enc["attention_mask"][rows], labels=labels[rows]).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    hf.eval()
    model = heedful.from_pretrained_objects(hf, tok, name="planted-wonderful")
    with torch.no_grad():
        predicted = hf(**enc).logits.argmax(-1)
    assert (predicted == labels).float().mean() > 0.97, "the planted model did not learn its rule"
    return model


def _planted_scores(problem, sign: float) -> torch.Tensor:
    """``sign`` on the tokens inside the planted word (it may be several word pieces), ties broken by position."""
    batch = problem.batch
    scores = torch.arange(batch.seq_len, dtype=torch.float32).repeat(len(batch), 1) * 1e-3
    for b, text in enumerate(batch.texts):
        start = text.find(PLANTED)
        for i, offset in enumerate(batch.offsets[b]):
            if start >= 0 and offset is not None and start <= offset[0] < start + len(PLANTED):
                scores[b, i] += sign
    return scores


@pytest.fixture(scope="module")
def methods():
    @heedful.register("planted_first", family="baseline", cost="no pass of its own")
    def planted_first(problem) -> torch.Tensor:
        """The planted word's tokens score 1, the others about 0 ``[B, N]``.

        Source: a test of heedful.inside.counterfactual.
        """
        return _planted_scores(problem, 1.0)

    @heedful.register("planted_last", family="baseline", cost="no pass of its own")
    def planted_last(problem) -> torch.Tensor:
        """The planted word's tokens score -1, the others about 0 ``[B, N]``.

        Source: a test of heedful.inside.counterfactual.
        """
        return _planted_scores(problem, -1.0)

    yield ("planted_first", "planted_last")
    for name in ("planted_first", "planted_last"):
        heedful.registry.unregister(name)


def test_an_explanation_naming_the_planted_word_is_confirmed_and_one_hiding_it_is_not(planted, methods):
    texts = [t for t in _sentences() if PLANTED in t.split()][:40]
    report = counterfactual_test(planted, texts, list(methods), k=1, tagger=regex_tagger(TAGS), corpus=_sentences(), seed=0)
    summary = report.summary().set_index(["method", "edit"])
    first, last = summary.loc[("planted_first", "replace")], summary.loc[("planted_last", "replace")]
    assert first["n"] == last["n"] == 40
    assert first["share"] >= 0.95 and first["low"] > 0.8
    assert last["share"] <= 0.1
    assert first["gap"] > 0.3 and first["gap_low"] > 0
    # the model reads the word, not where it stands: swapping the two top words keeps its prediction
    assert summary.loc[("planted_first", "swap"), "share"] >= 0.9
    # "not wonderful" still holds the planted word: negating it is no stronger than negating another adjective
    assert summary.loc[("planted_first", "negate"), "share"] < first["share"]
    assert "planted_first" in str(report.table().title) or report.table().row_count == len(summary)


def test_the_edits_are_realistic_and_seeded():
    text = "the movie was dull and the plot was funny"
    words = regex_tagger(TAGS)([text])[0]
    pool = vocabulary(regex_tagger(TAGS)(_sentences()))
    scores = np.array([0, 0.5, 0, 3.0, 0, 0, 0.2, 0, 1.0])  # dull > funny > movie > plot
    found = {h.edit: h for h in hypotheses(0, "m", text, words, scores, pool, 1, ("replace", "negate", "swap"), seed=0)}
    replace = found["replace"]
    assert replace.top == ["dull"] and replace.control != ["dull"]
    new = replace.texts[0].split()
    assert new[3] != "dull" and new[3] in ADJECTIVES and new[:3] == ["the", "movie", "was"]  # same tag, same place
    assert found["negate"].texts[0] == "the movie was not dull and the plot was funny"
    assert found["negate"].texts[1] == "the movie was dull and the plot was not funny"
    assert found["swap"].texts == ("the movie was funny and the plot was dull",)
    again = {h.edit: h for h in hypotheses(0, "m", text, words, scores, pool, 1, ("replace",), seed=0)}
    assert again["replace"].texts == replace.texts


def test_edited_keeps_the_rest_of_the_text():
    words = [Word(4, 9, "movie", "NOUN", "NN"), Word(14, 18, "dull", "ADJ", "JJ")]
    assert edited("the movie was dull.", [(words[1], "fine"), (words[0], "film")]) == "the film was fine."


def test_wilson_interval():
    low, high = wilson(8, 10)
    assert math.isclose(low, 0.4902, abs_tol=1e-4) and math.isclose(high, 0.9433, abs_tol=1e-4)
    assert wilson(0, 5)[0] == 0.0 and all(math.isnan(v) for v in wilson(0, 0))


def test_bad_input_is_one_line(planted):
    with pytest.raises(heedful.InputError, match="unknown edit"):
        counterfactual_test(planted, ["the movie was dull"], ["saliency"], edits=("shuffle",), tagger=regex_tagger(TAGS))
    with pytest.raises(heedful.MethodError, match="unknown method"):
        counterfactual_test(planted, ["the movie was dull"], ["salincy"], tagger=regex_tagger(TAGS))
    lm = heedful.testing.tiny_model("llama", "causal_lm")
    with pytest.raises(heedful.InputError, match="read a classifier's prediction"):
        counterfactual_test(lm, ["the movie was dull"], ["saliency"], tagger=regex_tagger(TAGS))


def test_cli_prints_the_share_confirmed_per_method(planted, methods, tmp_path, monkeypatch, capsys):
    import csv

    from conftest import run_cli

    import heedful.inside.counterfactual as counterfactual

    folder = tmp_path / "planted"
    planted.hf_model.save_pretrained(folder)
    planted.tokenizer.save_pretrained(folder)
    data = tmp_path / "reviews.csv"
    with open(data, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows((t, "POSITIVE") for t in [t for t in _sentences() if PLANTED in t.split()][:12])
    monkeypatch.setattr(counterfactual, "spacy_tagger", regex_tagger(TAGS))  # spaCy itself: the slow test below
    code, out, err = run_cli(
        monkeypatch, capsys, "counterfactual", "--model", str(folder), "--dataset", str(data), "--n", "12",
        "-M", "planted_first", "-M", "planted_last", "--edit", "replace", "--csv", str(tmp_path / "summary.csv"),
    )
    assert code == 0, err
    assert "planted_first" in out and "planted_last" in out and "replace" in out
    rows = list(csv.DictReader(open(tmp_path / "summary.csv", encoding="utf-8")))
    shares = {r["method"]: float(r["share"]) for r in rows}
    assert shares["planted_first"] > 0.9 and shares["planted_last"] < 0.1
    code, _, err = run_cli(monkeypatch, capsys, "counterfactual", "--model", str(folder), "--dataset", str(data), "-M", "random", "--margin", "2")
    assert code == 2 and "error: margin must be" in err


@pytest.mark.slow
def test_spacy_tags_the_words_an_edit_may_touch():
    from heedful.inside.counterfactual import spacy_tagger

    (words,) = spacy_tagger(["The movie was dull and far too long."])
    tags = {w.text: (w.pos, w.tag) for w in words}
    assert tags["movie"] == ("NOUN", "NN") and tags["dull"][0] == "ADJ"
