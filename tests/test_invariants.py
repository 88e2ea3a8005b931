"""Properties every method must have: a batch equals one text at a time, a seed fixes the scores,
scores are finite and one per token; and the Explanation type's views and exports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import INIT_RANGE, cached_model
from tiny import FAMILIES, tiny_model

import heedful
from heedful import testing
from heedful.errors import UnsupportedModelError
from heedful.explanation import Explanation

TEXTS = [
    "a charming , unbelievably affecting journey",
    "dull",
    "the movie was far too long",
]
ALL_METHODS = [m.name for m in heedful.methods()]
INVARIANCE_FAMILIES = ("bert", "roberta", "gpt2", "llama", "deberta-v2")
STOCHASTIC = [m.name for m in heedful.methods() if m.stochastic]

def fast_options(method: str, model) -> dict:
    """The options that keep ``method`` quick on ``model`` (:data:`heedful.testing.FAST_OPTIONS`)."""
    return testing.fast_options(heedful.get_method(method), model)


def explain_or_skip(model, texts, method, **options):
    """``model.explain``; a method may decline a family it has no rules for, but only with
    heedful's own UnsupportedModelError (a clear message and a hint), which skips the case."""
    try:
        return model.explain(texts, method, **options)
    except heedful.UnsupportedModelError as exc:
        assert exc.hint, f"{method} declined {model.adapter.family} without a hint"
        pytest.skip(f"{method} does not support {model.adapter.family}: {exc.message}")


def scale_tol(reference: np.ndarray, tol: float = 1e-5) -> float:
    return tol * max(1.0, float(np.abs(reference).max()))


# --------------------------------------------------------------------------- batching invariance


@pytest.mark.parametrize("family", INVARIANCE_FAMILIES)
@pytest.mark.parametrize("method", ALL_METHODS)
def test_batch_equals_one_text_at_a_time(method, family):
    model = cached_model(family)
    options = fast_options(method, model)
    batched = explain_or_skip(model, TEXTS, method, **options)
    for text, together in zip(TEXTS, batched, strict=True):
        alone = model.explain(text, method, **options)
        assert together.tokens == alone.tokens
        assert together.scores.shape[-1] == len(together.tokens)
        assert together.scores.shape == alone.scores.shape
        assert np.all(np.isfinite(together.scores))
        assert together.target == alone.target
        diff = float(np.abs(together.scores - alone.scores).max())
        assert diff <= scale_tol(alone.scores), f"{method} on {text!r}: batch differs by {diff:.3g}"


@pytest.mark.parametrize("method", ["normxlogit", "integrated_gradients", "leave_one_out"])
def test_batch_size_does_not_change_scores(method):
    model = cached_model("bert")
    options = fast_options(method, model)
    whole = model.explain(TEXTS, method, **options)
    split = model.explain(TEXTS, method, batch_size=2, **options)
    for a, b in zip(whole, split, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, atol=scale_tol(a.scores))


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("method", STOCHASTIC)
def test_seed_fixes_stochastic_scores(method):
    assert {"random", "smoothgrad"} <= set(STOCHASTIC)
    model = cached_model("bert")
    options = fast_options(method, model)
    text = TEXTS[0]
    first = model.explain(text, method, seed=3, **options).scores
    again = model.explain(text, method, seed=3, **options).scores
    other = model.explain(text, method, seed=4, **options).scores
    np.testing.assert_array_equal(first, again)
    assert np.abs(first - other).max() > 1e-6, "a different seed must give different scores"


def test_deterministic_methods_repeat_exactly():
    model = cached_model("llama")
    for method in ("normxlogit", "saliency", "leave_one_out", "rollout"):
        a = model.explain(TEXTS[0], method).scores
        b = model.explain(TEXTS[0], method).scores
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- shapes and values

SHAPE_CASES = (
    # the batching test above already covers classification on bert, roberta, gpt2, llama, deberta-v2
    [(f, "classification") for f in FAMILIES if f not in INVARIANCE_FAMILIES]
    + [("bert", "regression"), ("gpt2", "regression"), ("bert", "masked_lm"), ("roberta", "masked_lm"),
       ("gpt2", "causal_lm"), ("llama", "causal_lm")]
)


def text_for(model) -> list[str]:
    if model.task == "masked_lm":
        return [f"the movie was {model.tokenizer.mask_token}", f"a {model.tokenizer.mask_token} journey"]
    return TEXTS[:2]


@pytest.mark.parametrize(("family", "task"), SHAPE_CASES)
def test_every_method_gives_finite_scores_per_token(family, task):
    model = cached_model(family, task)
    texts = text_for(model)
    checked = declined = 0
    for info in heedful.methods(task=task):
        try:
            explanations = model.explain(texts, info.name, **fast_options(info.name, model))
        except heedful.UnsupportedModelError as exc:  # a method may decline a family, clearly
            assert exc.hint and family in exc.message
            declined += 1
            continue
        for e in explanations:
            assert e.method == info.name
            assert e.scores.shape == (len(e.tokens),), info.name
            assert len(e.tokens) == len(e.offsets) == len(e.word_ids) == len(e.special)
            assert np.all(np.isfinite(e.scores)), f"{info.name}: non-finite scores {e.scores}"
            assert e.cost.seconds >= 0 and e.cost.forward_passes >= 1
            assert e.prediction, "the model's own prediction is recorded"
            checked += 1
    assert checked == 2 * (len(heedful.methods(task=task)) - declined)
    assert checked >= 24, "the core methods support every family"


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_every_method_runs_in_float64(family):
    """No method may hard-code float32 (``heedful.load(..., dtype=...)`` accepts other dtypes)."""
    model = tiny_model(family, initializer_range=INIT_RANGE)
    model.hf_model.to(torch.float64)
    ran = 0
    for info in heedful.methods():
        try:
            e = model.explain(["a charming journey", "dull"], info.name, **fast_options(info.name, model))[0]
        except heedful.UnsupportedModelError:
            continue
        assert np.all(np.isfinite(e.scores)), info.name
        ran += 1
    assert ran >= 12


@pytest.mark.parametrize("method", [m.name for m in heedful.methods() if m.layerwise])
def test_layerwise_methods_give_a_layer_by_token_map(method):
    model = cached_model("gpt2")
    options = {**fast_options(method, model), "layerwise": True}
    e = model.explain(TEXTS[0], method, **options)
    assert e.layerwise and e.scores.shape == (model.adapter.num_layers, len(e.tokens))
    assert np.all(np.isfinite(e.scores))


def test_cost_counts_passes():
    model = cached_model("bert")
    e = model.explain(TEXTS[2], "leave_one_out")
    content = sum(not s for s in e.special)
    assert e.cost.forward_passes == 1 + content and e.cost.backward_passes == 0
    e = model.explain(TEXTS[2], "integrated_gradients", n_steps=7)
    assert e.cost.forward_passes in (7, 1 + 7) and e.cost.backward_passes == 7
    e = model.explain(TEXTS[2], "normxlogit")
    assert e.cost.forward_passes == 1 and e.cost.backward_passes == 0
    batch = model.explain(TEXTS, "saliency")  # per example, whatever the batch size
    assert all(x.cost.forward_passes in (1, 2) and x.cost.backward_passes == 1 for x in batch)


def test_methods_registry_describes_each_method():
    infos = heedful.methods()
    names = [m.name for m in infos]
    required = {
        "random", "embedding_norm", "logat", "normxlogit", "saliency", "grad_x_input",
        "integrated_gradients", "smoothgrad", "raw_attention", "rollout", "leave_one_out",
    }
    assert required <= set(names)
    assert len(names) == len(set(names))
    for m in infos:
        assert m.family and m.cost and m.citation and m.summary and m.tasks
        assert heedful.get_method(m.name) is m
        assert m.fn.__doc__, f"{m.name} has no docstring"
    assert {m.name for m in heedful.methods(family="gradient")} >= {"saliency", "integrated_gradients"}
    assert heedful.get_method("integrated-gradients").name == "integrated_gradients"


# --------------------------------------------------------------------------- Explanation


@pytest.fixture(scope="module")
def subword_explanation() -> Explanation:
    model = cached_model("bert")
    e = model.explain("unbelievably charming , often affecting", "grad_x_input")
    assert any(t.startswith("##") for t in e.tokens), "the text must contain sub-words"
    return e


@pytest.mark.parametrize("agg", ["sum", "mean", "max", "first", "last"])
def test_words_aggregate_subwords(subword_explanation, agg):
    e = subword_explanation
    ws = e.words(agg)
    assert ws.words == ["unbelievably", "charming", ",", "often", "affecting"]
    assert ws.aggregation == agg and ws.scores.shape == (5,)
    reducer = {"sum": np.sum, "mean": np.mean, "max": np.max, "first": lambda s: s[0], "last": lambda s: s[-1]}[agg]
    for w, (word, idx, (start, end)) in enumerate(zip(ws.words, ws.token_indices, ws.spans, strict=True)):
        assert e.text[start:end] == word
        assert all(not e.special[i] for i in idx) and idx == list(range(idx[0], idx[-1] + 1))
        assert ws.scores[w] == pytest.approx(reducer(e.scores[idx]))
    assert len(ws.token_indices[0]) > 1
    assert [word for word, _ in ws] == ws.words
    assert ws.to_dict()["words"] == ws.words


def test_words_aggregations_differ_on_subwords(subword_explanation):
    e = subword_explanation
    first = e.words("first").scores[0]
    last = e.words("last").scores[0]
    total = e.words("sum").scores[0]
    assert len({round(float(x), 9) for x in (first, last, total)}) == 3
    with pytest.raises(ValueError, match="agg"):
        e.words("median")


def test_layerwise_words_and_pandas():
    model = cached_model("bert")
    e = model.explain("unbelievably charming", "normxlogit", layerwise=True)
    ws = e.words("mean")
    assert ws.scores.shape == (model.adapter.num_layers, 2)
    frame = e.to_pandas()
    assert [f"layer_{k}" for k in range(1, model.adapter.num_layers + 1)] == [c for c in frame.columns if c.startswith("layer_")]
    np.testing.assert_allclose(frame["layer_2"].to_numpy(), e.scores[1])


def test_json_round_trip(subword_explanation):
    e = subword_explanation
    data = json.loads(e.to_json())
    assert data["tokens"] == e.tokens and data["method"] == "grad_x_input"
    assert len(data["scores"]) == len(data["tokens"])
    back = Explanation.from_dict(data)
    assert isinstance(back.scores, np.ndarray)
    np.testing.assert_array_equal(back.scores, e.scores)
    assert back.offsets == e.offsets and back.target == e.target and back.cost == e.cost
    for name in ("text", "tokens", "word_ids", "special", "segments", "method", "options", "model", "prediction"):
        assert getattr(back, name) == getattr(e, name), name
    assert back.to_dict() == e.to_dict()
    assert back.words("sum").words == e.words("sum").words


def test_json_round_trip_of_a_text_pair():
    model = cached_model("bert")
    e = model.explain("great acting", "normxlogit", text_pair="a dull plot")
    assert e.text_pair == "a dull plot"
    assert e.words().words == ["great", "acting", "a", "dull", "plot"]
    back = Explanation.from_dict(json.loads(e.to_json()))
    assert back.text_pair == e.text_pair and back.words().words == e.words().words


def test_to_pandas(subword_explanation):
    e = subword_explanation
    frame = e.to_pandas()
    assert list(frame.columns) == ["position", "token", "raw_token", "word_id", "special", "start", "end", "score"]
    assert len(frame) == len(e.tokens)
    assert frame["token"].tolist() == e.tokens
    np.testing.assert_array_equal(frame["score"].to_numpy(), e.scores)
    assert frame["special"].tolist() == e.special
    assert bool(frame["special"].iloc[0]) and frame["token"].iloc[0] == "[CLS]"


def test_top(subword_explanation):
    e = subword_explanation
    top = e.top(3)
    assert len(top) == 3
    content = [(t, s) for t, s, sp in zip(e.tokens, e.scores, e.special, strict=True) if not sp]
    best = sorted(content, key=lambda p: -p[1])[:3]
    assert [t for t, _ in top] == [t for t, _ in best]
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert all(t not in ("[CLS]", "[SEP]") for t, _ in e.top(100))
    assert len(e.top(100)) == len(content)


def test_explain_returns_one_or_a_list():
    model = cached_model("bert")
    assert isinstance(model.explain("great acting"), Explanation)
    many = model.explain(["great acting", "dull"])
    assert isinstance(many, list) and [e.text for e in many] == ["great acting", "dull"]
    assert model.explain(["great acting"])[0].text == "great acting"


@pytest.mark.parametrize("method", ["gae", "grad_sam", "attcat", "cam", "attention_gradcam"])
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_attention_gradient_methods_reuse_the_reference_pass(method, family):
    """One forward and one backward per example, with the scores of a pass of their own."""
    from heedful import get_method

    model = cached_model(family)
    explained = model.explain(TEXTS[:2], method)
    assert all(e.cost.forward_passes == 1 and e.cost.backward_passes == 1 for e in explained)
    own_pass = get_method(method)(model.prepare(TEXTS[:2]))
    for b, e in enumerate(explained):
        np.testing.assert_allclose(e.scores, own_pass[b, : len(e.tokens)].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_every_method_gives_the_same_scores_on_a_plainly_prepared_problem(family):
    """A problem prepared without a method's own reference pass (no kept graph, no hidden
    states, no LRP forward) gets the scores explain computes with it: a method runs what it
    lacks."""
    model = cached_model(family)
    problem = model.prepare(TEXTS[:2])
    for info in heedful.methods(task=model.task):
        options = fast_options(info.name, model)
        try:
            direct = model.explain(TEXTS[:2], info.name, **options)
        except UnsupportedModelError as declined:  # e.g. alti_logit on the post-LN BERT: so does the prepared problem
            assert declined.hint, info.name
            with pytest.raises(UnsupportedModelError):
                model.explain(problem, info.name, **options)
            continue
        prepared = model.explain(problem, info.name, **options)
        for a, b in zip(direct, prepared, strict=True):
            scale = max(np.abs(a.scores).max(), 1e-12)
            np.testing.assert_allclose(b.scores, a.scores, rtol=1e-4, atol=5e-5 * scale, err_msg=info.name)
