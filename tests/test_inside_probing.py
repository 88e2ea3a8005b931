"""Probes (heedful.inside.probing, amnesic): per-layer accuracies equal to a plain scikit-learn
pipeline on features computed independently from ``output_hidden_states``; the control task,
MDL codelength and expected layer by their definitions; INLP by its defining property (a fresh
probe at majority-class accuracy); amnesic probing, and the command line with its bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from heedful.datasets import Dataset, Example
from heedful.datasets import load as load_dataset
from heedful.errors import InputError
from heedful.inside.amnesic import inlp, nullspace_projection, task_score
from heedful.inside.probing import control_labels, expected_from, online_codelength, probe
from heedful.inside.properties import property_items
from heedful.inside.representations import span_features
from heedful.testing import CORPUS

TEXTS = [*CORPUS, "the acting is superb and the music is lovely", "a boring film with a silly ending",
         "the director made two films in paris", "i hated the second half of the movie"]


def _dataset(texts=TEXTS) -> Dataset:
    return Dataset("probe-texts", "test", [Example(str(i), t, label=i % 2) for i, t in enumerate(texts)])


def _oracle_features(model, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """``[L + 1, K, D]``: mean of ``hidden_states[l]`` over the tokens overlapping each span,
    from the transformers model alone (one text, no batching, no heedful code)."""
    enc = model.tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        hidden = model.hf_model(**enc, output_hidden_states=True).hidden_states
    rows = []
    for start, end in spans:
        hits = [t for t, (s, e) in enumerate(offsets) if e > s and s < end and e > start]
        rows.append(torch.stack([h[0, hits].mean(0) for h in hidden]))
    return torch.stack(rows, dim=1).numpy()


def test_probe_accuracies_equal_a_plain_sklearn_pipeline_on_output_hidden_states(tiny):
    """The oracle: spaCy's part-of-speech items, features pooled from ``output_hidden_states``
    text by text, ``StandardScaler`` + ``LogisticRegression`` fitted on the train texts and
    scored on the test texts of the result's split."""
    model = tiny("bert")
    data = _dataset()
    result = probe(model, data, "pos", "all", control=False, expected_layer=False, test_fraction=0.3, seed=1)
    texts, items = property_items(data, "pos")
    feats = np.concatenate([_oracle_features(model, t, [i.span for i in items if i.example == e]) for e, t in enumerate(texts)], axis=1)
    y = np.asarray([i.label for i in items])
    test = np.isin([i.example for i in items], result.test_examples)
    assert 0 < test.sum() < len(y) and result.test_items == test.sum()
    for layer, score in enumerate(result.scores):
        oracle = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=0))
        expected = oracle.fit(feats[layer][~test], y[~test]).score(feats[layer][test], y[test])
        assert score.layer == layer
        assert abs(score.accuracy - expected) <= 1.0 / test.sum() + 1e-12, (layer, score.accuracy, expected)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_span_features_of_a_decoder_equal_its_hidden_states(tiny, family):
    """Layers 0 .. L-1 read through the roles are ``hidden_states[l]`` (the last block's output
    is read before the final norm, which ``hidden_states[L]`` includes)."""
    model = tiny(family, "causal_lm")
    text = "the sister of the doctors writes a letter"
    spans = [(4, 10), (18, 25), (0, len(text))]
    from heedful.inside.representations import Item

    items = [Item(0, span, "x", "w") for span in spans]
    found, kept = span_features(model, [text, "a second text in the batch"], items, list(range(model.adapter.num_layers)))
    expected = _oracle_features(model, text, spans)
    assert kept.all()
    np.testing.assert_allclose(found, expected[: model.adapter.num_layers], rtol=1e-4, atol=1e-5)


def test_control_labels_are_one_random_label_per_word_type():
    words = ["the", "cat", "the", "dog", "cat", "a"] * 50
    labels = np.asarray(["DET", "NOUN", "DET", "NOUN", "NOUN", "DET"] * 50)
    control = control_labels(words, labels, seed=0)
    for word in set(words):
        assert len(set(control[[i for i, w in enumerate(words) if w == word]])) == 1
    assert set(control) <= set(labels)
    assert np.array_equal(control, control_labels(words, labels, seed=0))
    assert any(not np.array_equal(control, control_labels(words, labels, seed=s)) for s in range(1, 6))


def test_online_codelength_is_short_for_informative_and_uniform_for_noise_features():
    """Voita & Titov: features that give the label away cost far less than the uniform code
    ``n log2 K``; features independent of the label cost about the uniform code (the first
    block is sent uniformly, the probes can only learn the label frequencies)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=1200).astype(str)
    noise = rng.standard_normal((1200, 8))
    informative = np.eye(4)[y.astype(int)] * 3 + 0.1 * rng.standard_normal((1200, 4))
    uniform = 1200 * math.log2(4)
    assert online_codelength(informative, y, 4) < 0.2 * uniform
    assert 0.95 * uniform < online_codelength(noise, y, 4) < 1.1 * uniform


def test_expected_layer_is_tenney_eq_4():
    assert expected_from([0, 1, 2], [0.5, 0.7, 0.8]) == pytest.approx((1 * 0.2 + 2 * 0.1) / 0.3)
    assert expected_from([0, 1], [0.5, 0.5]) is None


def test_per_item_outcomes_are_the_reported_accuracies_item_by_item(tiny):
    """``per_item=True`` keeps, per test item, whether each layer's probe, control probe and
    cumulative probe got it right: their means are the reported accuracies, and the items are
    the test split's, in order."""
    result = probe(tiny("bert"), _dataset(), "pos", "all", seed=2, per_item=True)
    per = result.per_item
    assert len(per["text"]) == result.test_items and set(per["text"]) <= set(result.test_examples)
    for score, hits, control in zip(result.scores, per["hits"], per["control_hits"], strict=True):
        assert np.mean(hits) == pytest.approx(score.accuracy) and np.mean(control) == pytest.approx(score.control_accuracy)
    assert np.mean(per["cumulative_hits"], axis=1) == pytest.approx(result.cumulative)
    assert result.expected_layer == pytest.approx(expected_from(range(len(result.scores)), np.mean(per["cumulative_hits"], axis=1)))
    assert probe(tiny("bert"), _dataset(), "pos", "all", seed=2).per_item is None


def test_inlp_leaves_a_fresh_probe_at_majority_accuracy():
    """Ravfogel et al.'s defining property: after the projection no linear probe -- a fresh
    scikit-learn pipeline, with standardisation -- beats the majority class on held-out items,
    while the projection is an orthogonal projection (``P = P^T = P^2``) of the stated rank."""
    rng = np.random.default_rng(0)
    n, width = 1500, 20
    y = rng.integers(0, 3, size=n)
    X = rng.standard_normal((n, width))
    X[:, :4] += np.eye(3, 4)[y] * 2.0 + (y[:, None] == 2) * rng.standard_normal((n, 1))
    held = rng.random(n) < 0.3
    found = inlp(X, y, held, iterations=30)
    P = found.projection
    np.testing.assert_allclose(P, P.T, atol=1e-10)
    np.testing.assert_allclose(P @ P, P, atol=1e-10)
    assert found.rank == width - round(np.trace(P)) and found.rank >= 2
    assert found.accuracies[0] > 0.8
    fresh = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit((X @ P)[~held], y[~held])
    counts = np.bincount(y[held])
    assert fresh.score((X @ P)[held], y[held]) <= counts.max() / counts.sum() + 0.03


def test_nullspace_projection_removes_exactly_the_directions():
    rng = np.random.default_rng(1)
    directions = rng.standard_normal((3, 10))
    P = nullspace_projection(directions, 10)
    np.testing.assert_allclose(directions @ P, 0, atol=1e-10)
    assert round(np.trace(P)) == 7


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_amnesic_projection_acts_on_the_layers_residual_stream(tiny, layer):
    """``projected`` makes layer ``layer``'s stream ``h @ P`` (a recording registered after it
    sees the projected tensor), and the task score with the identity is the untouched one."""
    from heedful.inside.amnesic import projected
    from heedful.inside.representations import layer_states

    model = tiny("bert")
    batch = model.encode(TEXTS[:3])
    plain = layer_states(model, batch, [layer])[0]
    P = torch.as_tensor(nullspace_projection(np.random.default_rng(0).standard_normal((5, plain.shape[-1])), plain.shape[-1]), dtype=plain.dtype)
    role, block = ("block_in", 0) if layer == 0 else ("block_out", layer - 1)
    with torch.no_grad(), model.adapter.intercept() as hooks:
        projected(hooks, layer, P)
        seen = hooks.record(role, [block])
        model.adapter.forward(batch, model.adapter.anchor_positions(batch)[0])
    torch.testing.assert_close(seen[block], plain @ P)
    what, score = task_score(model, _dataset())
    assert what == "label accuracy" and score(np.eye(plain.shape[-1]), layer) == score(None, layer)


def test_amnesic_probing_on_a_causal_lm_reports_next_token_accuracy(tiny):
    from heedful.inside.amnesic import amnesic

    result = amnesic(tiny("llama", "causal_lm"), load_dataset("agreement", "test", 40), "number", 1, iterations=5)
    assert result.task == "next-token accuracy" and 0 <= result.task_before <= 1
    assert result.probe_after <= result.probe_before or result.rank == 0
    if result.rank == 0:  # nothing was linearly decodable beyond the majority class: nothing removed
        assert result.task_amnesic == result.task_before == result.task_random


def test_probe_refuses_bad_input(tiny):
    model = tiny("bert")
    with pytest.raises(InputError, match="does not exist"):
        probe(model, _dataset(), "label", [0, 9])
    with pytest.raises(InputError, match="did you mean 'pos'"):
        probe(model, _dataset(), "poss")
    with pytest.raises(InputError, match="grammatical number"):
        probe(model, _dataset(), "number")
    with pytest.raises(InputError, match="test_fraction"):
        probe(model, _dataset(), "label", test_fraction=1.5)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert")


def test_cli_probe_prints_layers_and_writes_a_plot(monkeypatch, capsys, bert_dir, tmp_path):
    picture = tmp_path / "number.png"
    code, out, err = run_cli(
        monkeypatch, capsys, "probe", "--model", bert_dir, "--property", "number", "--layers", "all", "-n", "60",
        "--mdl", "--amnesic", "1", "--plot", str(picture),
    )
    assert code == 0, err
    for word in ("accuracy", "control", "selectivity", "compression", "expected layer", "amnesic probing at layer 1"):
        assert word in out, out
    assert picture.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "0,x"], "comma-separated"),
        (["--layers", "12"], "does not exist"),
        (["--property", "colour"], "unknown property"),
        (["--pooling", "max"], "unknown pooling"),
        (["-n", "0"], "at least 1"),
    ],
)
def test_cli_probe_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, bert_dir, tmp_path, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "probe", "--model", bert_dir, "--dataset", "agreement", "--plot", str(tmp_path / "p.png"), *args)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_dependency_items_are_edges_to_the_head_and_pair_features_concatenate(tiny):
    """Edge probing's ``dep``: one item per non-root word, its span and its head's span, labelled
    with the relation; the pair's features are ``[pool(dependent); pool(head)]``."""
    text = "The sister of the doctors writes a letter."
    texts, items = property_items(_dataset([text, "Critics loved the film."]), "dep")
    first = [i for i in items if i.example == 0]
    assert {text[slice(*i.span)] for i in first} == {w for w in ("The", "sister", "of", "the", "doctors", "a", "letter", ".")}
    subject = next(i for i in first if text[slice(*i.span)] == "sister")
    assert subject.label == "nsubj" and text[slice(*subject.pair)] == "writes"
    model = tiny("bert")
    feats, kept = span_features(model, texts, items, [0, 2])
    width = model.adapter.hidden_size
    assert feats.shape == (2, len(items), 2 * width) and kept.all()
    alone, _ = span_features(model, texts, [subject.__class__(0, subject.span, "", ""), subject.__class__(0, subject.pair, "", "")], [0, 2])
    k = items.index(subject)
    np.testing.assert_allclose(feats[:, k, :width], alone[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(feats[:, k, width:], alone[:, 1], rtol=1e-5, atol=1e-6)
