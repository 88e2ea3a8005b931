"""``heedful serve``'s causal tracing (``POST /api/trace``) and steering (``POST /api/steer``)
routes on tiny seeded models: their answers against ``heedful.inside`` called directly, their
progress as jobs, and bad input as the API's one-line errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="heedful serve needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402
from test_serve_api import error_of, events  # noqa: E402

import heedful  # noqa: E402
from heedful.inside import steering  # noqa: E402
from heedful.serve import ServeSettings, create_app  # noqa: E402

CLASSIFIER, LM, BARE = "tiny-bert", "tiny-gpt2", "tiny-bloom"
PROMPT = "the capital of france is"


def bloom():
    """A causal LM whose family maps no roles (tracing refuses it)."""
    import torch
    import transformers as tf

    from heedful.testing import bytelevel_tokenizer

    tok = bytelevel_tokenizer()
    torch.manual_seed(0)
    hf = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=len(tok), hidden_size=32, n_layer=2, n_head=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return heedful.from_pretrained_objects(hf, tok)


@pytest.fixture(scope="module")
def models(tiny):
    return {CLASSIFIER: tiny("bert", "classification"), LM: tiny("gpt2", "causal_lm"), BARE: bloom()}


@pytest.fixture(scope="module")
def client(models):
    settings = ServeSettings(models=list(models))
    with TestClient(create_app(settings, preloaded=models), base_url="http://127.0.0.1") as found:
        yield found


def grid(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


@pytest.mark.parametrize("kind", ["residual", "mlp"])
def test_trace_answers_the_library_grid(client, models, kind):
    body = {"model": LM, "prompt": PROMPT, "corrupt": "france", "kind": kind, "samples": 3}
    data = client.post("/api/trace", json=body).json()
    direct = heedful.trace(models[LM], PROMPT, corrupt="france", kind=kind, samples=3)
    assert data["columns"] == direct.columns and data["corrupted"] == direct.corrupted
    assert all("Ġ" not in c and "▁" not in c for c in data["columns"])  # decoded text, not tokenizer symbols
    np.testing.assert_allclose(grid(data["effect"]), direct.effect, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(grid(data["atp"]), direct.atp, atol=1e-6, equal_nan=True)
    assert data["spearman"] == pytest.approx(direct.spearman, abs=1e-9)
    colors = data["effect_colors"]
    assert len(colors) == direct.layers and {len(row) for row in colors} == {len(direct.columns)}
    top = np.unravel_index(np.nanargmax(np.abs(direct.effect)), direct.effect.shape)
    assert colors[top[0]][top[1]] in ("rgb(214,96,77)", "rgb(67,147,195)")  # the renderers' full warm or cool


def test_trace_with_a_counterfactual_prompt(client, models):
    body = {"model": LM, "prompt": PROMPT, "counterfactual": "the capital of frence is", "kind": "attn", "window": 2}
    data = client.post("/api/trace", json=body).json()
    direct = heedful.trace(models[LM], PROMPT, counterfactual="the capital of frence is", kind="attn", window=2)
    assert data["counterfactual"] == "the capital of frence is" and data["corrupted"] == direct.corrupted
    np.testing.assert_allclose(grid(data["effect"]), direct.effect, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(grid(data["atp"]), direct.atp, atol=1e-6, equal_nan=True)


def test_trace_runs_as_a_job_with_progress(client):
    ident = client.post("/api/jobs", json={"kind": "trace", "request": {"model": LM, "prompt": PROMPT, "corrupt": "capital", "samples": 2}})
    assert ident.status_code == 202
    found = events(client, ident.json()["id"])
    assert [name for name, _ in found][0] == "progress" and found[-1][0] == "result"
    assert found[0][1]["stage"].startswith("tracing residual")
    assert len(found[-1][1]["effect"][0]) == len(found[-1][1]["columns"])


@pytest.mark.parametrize(
    "change,status,message",
    [
        ({"corrupt": "paris"}, 422, "'paris' is not in the prompt"),
        ({"corrupt": "France"}, 422, "the match is case-sensitive"),
        ({"corrupt": None}, 422, "give either a span to corrupt"),
        ({"counterfactual": "the capital of italy is"}, 422, "give either a span to corrupt"),
        ({"corrupt": None, "counterfactual": "the capital of italy is"}, 422, "the counterfactual prompt has"),
        ({"kind": "neuron"}, 422, "kind"),
        ({"window": 0}, 422, "window must be at least 1"),
        ({"samples": 21}, 422, "samples"),
        ({"prompt": " "}, 422, "no prompt given"),
        ({"model": BARE}, 422, "not mapped"),
        ({"model": "nope"}, 404, "unknown model 'nope'"),
    ],
)
def test_bad_trace_requests_are_one_line(client, change, status, message):
    body = {"model": LM, "prompt": PROMPT, "corrupt": "france", "samples": 2, **change}
    assert message in error_of(client.post("/api/trace", json=body), status)["error"]


def test_steer_answers_the_library_generations(client, models):
    model = models[LM]
    body = {"model": LM, "prompt": "the movie was", "positive": "i love this", "negative": "i hate this", "layer": 1, "coefficient": 8.0, "max_new_tokens": 5}
    data = client.post("/api/steer", json=body).json()
    vector = steering.contrastive(model, "i love this", "i hate this", 1)
    decode = model.tokenizer.decode
    plain = model.generate("the movie was", 5).continuations[0]
    steered = vector.generate(model, "the movie was", 8.0, 5).continuations[0]
    assert data["without"] == decode(plain, skip_special_tokens=True)
    assert data["with"] == decode(steered, skip_special_tokens=True)
    assert data["where"] == "block 1" and data["norm"] == pytest.approx(float(vector.vector.norm()), rel=1e-6)
    assert plain != steered  # the vector does change the tiny model's greedy continuation


@pytest.mark.parametrize(
    "change,status,message",
    [
        ({"layer": 9}, 422, "layer 9 does not exist"),
        ({"model": CLASSIFIER}, 422, "steering changes what a language model writes"),
        ({"max_new_tokens": 33}, 422, "max_new_tokens=33 is not in [1, 32]"),
        ({"positive": ""}, 422, "no positive prompt given"),
        ({"coefficient": "lots"}, 422, "coefficient"),
    ],
)
def test_bad_steer_requests_are_one_line(client, change, status, message):
    body = {"model": LM, "prompt": "the movie was", "positive": "good", "negative": "bad", "layer": 0, "max_new_tokens": 2, **change}
    assert message in error_of(client.post("/api/steer", json=body), status)["error"]
