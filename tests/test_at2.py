"""AT2 (heedful.attribution.at2): its head features, scores and training objective against plain
loops over the transformers model's own attention probabilities and outputs, its learned
weights' files, its refusal without weights, and conformance with learned weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import cached_model, run_cli
from test_context import _plain_output

from heedful import UnsupportedModelError, zoo
from heedful.attribution import at2
from heedful.engine.sources import token_sources
from heedful.fingerprint import model_fingerprint
from heedful.testing import check_method

TEXTS = ["It rained all day. We stayed in and read. The cat slept on the mat.", "Rain fell. We read. Cats slept. Sun came."]


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return cached_model(request.param, "causal_lm")


def _plain_features(lm, text: str, sources, rows: list[int], ids: list[int] | None = None) -> np.ndarray:
    """``[S, L*H]`` by hand: the model's own attention probabilities (``output_attentions``) from
    the rows ``rows``, averaged over them, summed over each source's tokens."""
    ids = lm.tokenizer(text)["input_ids"] if ids is None else ids
    owner = token_sources(lm.encode(text).offsets[0], sources)
    with torch.no_grad():
        attentions = lm.hf_model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    heads = attentions[0].shape[1]
    found = np.zeros((len(sources), len(attentions) * heads))
    for layer, probs in enumerate(attentions):
        for head in range(heads):
            for s in range(len(sources)):
                total = 0.0
                for row in rows:
                    total += sum(float(probs[0, head, row, j]) for j, o in enumerate(owner) if o == s)
                found[s, layer * heads + head] = total / len(rows)
    return found


def _learned(lm, tmp_path) -> tuple[list[at2.Ablations], np.ndarray, str]:
    problem = lm.prepare(TEXTS, target=" the", sources="sentences")
    data = at2.ablations(problem, n_ablations=8, seed=3)
    weights = at2.fit_heads(data, steps=60, learning_rate=0.05)
    shape = (len(lm.adapter.roles().blocks), -1)
    path = tmp_path / "heads.json"
    at2.HeadWeights(weights.reshape(shape), model_fingerprint(lm.adapter).weights, {"objective": at2.objective(weights, data)}).save(path)
    return data, weights, str(path)


@pytest.mark.parametrize("target", [" the", " a b"])
def test_head_features_are_the_attention_of_the_target_rows_summed_per_source(lm, target):
    texts = TEXTS if target == " the" else ["Rain fell. We read. Cats slept.", "Sun. Then rain came."]
    problem = lm.prepare(texts, target=target, sources="sentences")
    features = at2.head_features(problem)
    span = lm.tokenizer(target, add_special_tokens=False)["input_ids"]
    for b, text in enumerate(texts):
        ids = lm.tokenizer(text)["input_ids"]
        rows = [len(ids) - 1] if len(span) == 1 else list(range(len(ids) - 1, len(ids) - 1 + len(span)))
        sources = problem.sources.spans[b]
        full = ids if len(span) == 1 else ids + span
        expected = _plain_features(lm, text, sources, rows, full)
        np.testing.assert_allclose(features[b, : len(sources)].numpy(), expected, atol=1e-5)


def test_the_learned_weights_reproduce_the_training_objective_by_hand(lm, tmp_path):
    data, weights, path = _learned(lm, tmp_path)
    recorded = json.loads(open(path, encoding="utf-8").read())["record"]["objective"]
    column = lm.tokenizer(" the", add_special_tokens=False)["input_ids"][0]
    correlations = []
    for text, d in zip(TEXTS, data, strict=True):
        ids = lm.tokenizer(text)["input_ids"]
        sources = lm.explain(text, "at2", target=" the", sources="sentences", heads=path).sources
        owner = token_sources(lm.encode(text).offsets[0], sources)
        features = _plain_features(lm, text, sources, [len(ids) - 1])
        full = features @ weights  # each source's score
        predicted, outputs = [], []
        for mask in d.masks:
            kept = [t for t, o in zip(ids, owner, strict=True) if o == -1 or mask[o]]
            outputs.append(_plain_output(lm, kept, None, column, "logit_prob"))
            predicted.append(sum((1.0 if mask[s] else -1.0) * full[s] for s in range(len(sources))))
        np.testing.assert_allclose(outputs, d.outputs, atol=1e-4)
        p, o = np.array(predicted) - np.mean(predicted), np.array(outputs) - np.mean(outputs)
        correlations.append(float((p * o).sum() / np.sqrt((p * p).sum() * (o * o).sum())))
    assert recorded == pytest.approx(float(np.mean(correlations)), abs=1e-4)
    assert recorded == pytest.approx(at2.objective(weights, data), abs=1e-12)
    assert np.abs(weights).sum() == pytest.approx(1.0)
    assert recorded > at2.objective(np.full(len(weights), 1.0 / len(weights)), data)  # learning moved off the uniform start


def test_scores_are_the_weighted_sum_of_the_head_features(lm, tmp_path):
    _, weights, path = _learned(lm, tmp_path)
    for text in TEXTS:
        e = lm.explain(text, "at2", target=" the", sources="sentences", heads=path)
        ids = lm.tokenizer(text)["input_ids"]
        features = _plain_features(lm, text, e.sources, [len(ids) - 1])
        expected = [sum(weights[f] * features[s, f] for f in range(len(weights))) for s in range(len(e.sources))]
        np.testing.assert_allclose(e.source_scores().scores, expected, atol=1e-5)
        assert e.cost.forward_passes == 1  # the reference pass records the attention of the target rows


def test_uniform_heads_average_attention_over_every_head(lm):
    e = lm.explain(TEXTS[0], "at2", target=" the", sources="sentences", heads="uniform")
    ids = lm.tokenizer(TEXTS[0])["input_ids"]
    features = _plain_features(lm, TEXTS[0], e.sources, [len(ids) - 1])
    np.testing.assert_allclose(e.source_scores().scores, features.mean(axis=1), atol=1e-6)


def test_a_model_without_learned_weights_is_refused_naming_the_command(lm):
    with pytest.raises(UnsupportedModelError) as info:
        lm.explain(TEXTS[0], "at2", target=" the", sources="sentences")
    assert "heedful at2 train" in info.value.hint and "\n" not in info.value.message


def test_weights_of_another_model_are_refused(tmp_path):
    _, _, path = _learned(cached_model("llama", "causal_lm"), tmp_path)
    with pytest.raises(Exception, match="another model|layers x"):
        cached_model("gpt2", "causal_lm").explain(TEXTS[0], "at2", target=" the", sources="sentences", heads=path)


def test_shipped_weights_match_their_pins_and_models():
    decoders = {name for name, entry in zoo.ENTRIES.items() if entry.task == "causal_lm"}
    assert {s.model for s in at2.SHIPPED} == decoders, "every zoo decoder's weights ship with heedful"
    for shipped in at2.SHIPPED:
        assert at2.file_sha256(shipped.path) == shipped.sha256
        heads = at2.HeadWeights.load(shipped.path)
        assert heads.fingerprint == shipped.fingerprint and heads.record["model"] == shipped.model
        assert np.abs(heads.weights).sum() == pytest.approx(1.0)


def test_at2_conforms_with_learned_weights(tmp_path):
    _, _, path = _learned(cached_model("llama", "causal_lm"), tmp_path)
    assert check_method("at2", families=("llama",), tasks=("causal_lm",), options={"heads": path}) == ["llama/causal_lm"]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--lengths", "512,x"], "--lengths"), (["--ablations", "2"], "--ablations"), (["--held-out", "1"], "--held-out"), (["--docs", "0"], "--docs")],
)
def test_training_refuses_bad_settings_before_loading_a_model(monkeypatch, capsys, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "at2", "train", "--model", "no-such-model", *args)
    assert code == 2 and message in err and "Traceback" not in err
