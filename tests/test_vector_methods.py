"""NormXLogit, LogAt and embedding norms against a direct computation through each family's own
Hugging Face modules (Abbasi et al., NormXLogit; methods.md §2.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cached_model
from tiny import DECODERS, ENCODERS, FAMILIES

from heedful.errors import InputError

TEXTS = ["a charming and often affecting journey", "the movie was dull"]


def head_on_top(family: str, hf, h: torch.Tensor) -> torch.Tensor:
    """The classification head applied to ONE token's representation ``h`` ``[D]`` -> ``[C]``,
    written with the family's own modules as if the token were the pooled one."""
    x = h[None, None, :]  # [1, 1, D]: a one-token sequence
    if family == "bert":
        return hf.classifier(hf.dropout(hf.bert.pooler(x)))[0]
    if family == "distilbert":
        return hf.classifier(hf.dropout(torch.relu(hf.pre_classifier(x[:, 0]))))[0]
    if family in ("roberta", "electra"):
        return hf.classifier(x)[0]
    if family == "deberta-v2":
        return hf.classifier(hf.dropout(hf.pooler(x)))[0]
    assert family in DECODERS
    return hf.score(h)


def final_norm(family: str, hf):
    if family == "gpt2":
        return hf.transformer.ln_f
    if family == "opt":
        return hf.model.decoder.final_layer_norm
    return hf.model.norm


def hf_states(model, text: str):
    """Hugging Face's own pass over one text alone (no padding): ids, logits, hidden states."""
    enc = model.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.hf_model(**enc, output_hidden_states=True)
    return enc["input_ids"][0], out.logits[0], out.hidden_states


def anchor_of(family: str, n: int) -> int:
    return n - 1 if family in DECODERS else 0


def direct_logat(family, model, hidden: torch.Tensor, column: int) -> np.ndarray:
    """``HoT(h_i)[column]`` for every token, one token at a time."""
    with torch.no_grad():
        return np.array([float(head_on_top(family, model.hf_model, h)[column]) for h in hidden])


def assert_scores(ours: np.ndarray, expected: np.ndarray, atol: float = 1e-5) -> None:
    assert ours.shape == expected.shape
    assert np.abs(expected).max() > 1e-3, "direct scores ~0: the comparison would prove nothing"
    np.testing.assert_allclose(ours, expected, atol=atol * max(1.0, np.abs(expected).max()), rtol=1e-4)


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize("family", FAMILIES)
def test_normxlogit_equals_direct_head_computation(family):
    model = cached_model(family)
    explanations = model.explain(TEXTS, "normxlogit")  # one padded batch
    for text, e in zip(TEXTS, explanations, strict=True):
        ids, logits, hs = hf_states(model, text)
        pred = int(logits.argmax())
        if family in DECODERS:  # HF pools the last token: the head on h_L[last] is the model output
            torch.testing.assert_close(head_on_top(family, model.hf_model, hs[-1][0, -1]), logits)
        assert e.target.indices == [pred]
        norms = hs[0][0].norm(dim=-1).numpy()
        assert_scores(e.scores, norms * direct_logat(family, model, hs[-1][0], pred))


@pytest.mark.parametrize("family", FAMILIES)
def test_per_label_and_contrast(family):
    model = cached_model(family)
    text = TEXTS[0]
    ids, logits, hs = hf_states(model, text)
    pred = int(logits.argmax())
    other = (pred + 1) % 3
    norms = hs[0][0].norm(dim=-1).numpy()
    predicted = model.explain(text, "normxlogit").scores
    given = model.explain(text, "normxlogit", target=other)
    by_label = model.explain(text, "normxlogit", target=model.labels[other].lower())
    assert given.target.indices == [other] and given.target.label == model.labels[other]
    expected = norms * direct_logat(family, model, hs[-1][0], other)
    assert_scores(given.scores, expected)
    np.testing.assert_array_equal(by_label.scores, given.scores)
    assert np.abs(given.scores - predicted).max() > 1e-3, "per-label scores must depend on the label"
    contrast = model.explain(text, "normxlogit", target=(pred, other))
    assert contrast.target.kind == "contrast" and contrast.target.indices == [pred, other]
    assert_scores(contrast.scores, predicted - given.scores)
    spelled = model.explain(text, "normxlogit", target=f"{model.labels[pred]} vs {model.labels[other]}")
    np.testing.assert_allclose(spelled.scores, contrast.scores, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_logat_and_embedding_norm(family):
    model = cached_model(family)
    ids, logits, hs = hf_states(model, TEXTS[0])
    pred = int(logits.argmax())
    logat = model.explain(TEXTS[0], "logat").scores
    norm = model.explain(TEXTS[0], "embedding_norm").scores
    nxl = model.explain(TEXTS[0], "normxlogit").scores
    assert_scores(logat, direct_logat(family, model, hs[-1][0], pred))
    assert_scores(norm, hs[0][0].norm(dim=-1).numpy())
    np.testing.assert_allclose(nxl, logat * norm, atol=1e-6, rtol=1e-5)
    assert np.all(norm > 0)


@pytest.mark.parametrize("family", ["bert", "electra", "gpt2", "llama"])
def test_word_embedding_norm_option(family):
    model = cached_model(family)
    ids, logits, hs = hf_states(model, TEXTS[0])
    with torch.no_grad():
        word_norms = model.hf_model.get_input_embeddings()(ids).norm(dim=-1).numpy()
    logat = model.explain(TEXTS[0], "logat").scores
    ours = model.explain(TEXTS[0], "normxlogit", norm="word_embedding").scores
    assert_scores(ours, word_norms * logat)
    assert_scores(model.explain(TEXTS[0], "embedding_norm", norm="word_embedding").scores, word_norms)
    if family in ENCODERS:  # position/type embeddings and LayerNorm make the two norms differ
        default = model.explain(TEXTS[0], "normxlogit").scores
        assert np.abs(default - ours).max() > 1e-3


# --------------------------------------------------------------------------- regression


@pytest.mark.parametrize("family", FAMILIES)
def test_regression_uses_distance_to_the_anchor(family):
    """Paper Eq. 8: distance_i = |HoT(h_i) - HoT(h_anchor)| (anchor: [CLS], or the last token),
    computed one token at a time through the family's own head; the default ranks the tokens
    nearest the prediction first (LogAt = -distance), ``regression_rank="far"`` the equation as
    printed (LogAt = +distance); NormXLogit multiplies by the embedding norm (Eq. 9)."""
    model = cached_model(family, "regression")
    near = model.explain(TEXTS, "normxlogit")
    far = model.explain(TEXTS, "normxlogit", regression_rank="far")
    logat_near = model.explain(TEXTS, "logat")
    logat_far = model.explain(TEXTS, "logat", regression_rank="far")
    for k, text in enumerate(TEXTS):
        ids, logits, hs = hf_states(model, text)
        values = direct_logat(family, model, hs[-1][0], 0)
        anchor = anchor_of(family, len(ids))
        assert values[anchor] == pytest.approx(float(logits[0]), abs=1e-5)
        assert near[k].target.kind == "regression" and near[k].target.anchor == anchor
        distance = np.array([abs(v - values[anchor]) for v in values])
        norms = np.array([float(torch.linalg.vector_norm(h)) for h in hs[0][0]])
        assert_scores(logat_near[k].scores, -distance)
        assert_scores(logat_far[k].scores, distance)
        assert_scores(near[k].scores, -norms * distance)
        assert_scores(far[k].scores, norms * distance)
        assert near[k].scores[anchor] == pytest.approx(0.0, abs=1e-6)
        nearest = int(np.argmin(np.where(np.arange(len(ids)) == anchor, np.inf, distance * norms)))
        assert int(np.argsort(-near[k].scores)[1]) == nearest  # the anchor (0) first, then the nearest


# --------------------------------------------------------------------------- language models


def lm_text(model, task: str) -> str:
    if task == "masked_lm":
        return f"the movie was {model.tokenizer.mask_token} and far too long"
    return "the capital of france is"


LM_CASES = [(f, "masked_lm") for f in ENCODERS] + [(f, "causal_lm") for f in DECODERS]


@pytest.mark.parametrize(("family", "task"), LM_CASES)
def test_normxlogit_with_the_lm_head(family, task):
    model = cached_model(family, task)
    text = lm_text(model, task)
    ids, logits, hs = hf_states(model, text)  # logits [N, V]: the LM head at every position
    if task == "masked_lm":
        anchor = int((ids == model.tokenizer.mask_token_id).nonzero()[0, 0])
    else:
        anchor = len(ids) - 1
    predicted = int(logits[anchor].argmax())
    second = int(logits[anchor].topk(2).indices[1])
    norms = hs[0][0].norm(dim=-1).numpy()
    e = model.explain(text, "normxlogit")
    assert e.target.indices == [predicted] and e.target.anchor == anchor
    assert e.target.label == model.adapter.readable_tokens([predicted])[0]
    assert_scores(e.scores, norms * logits[:, predicted].numpy())
    given = model.explain(text, "normxlogit", target=second)
    assert_scores(given.scores, norms * logits[:, second].numpy())
    contrast = model.explain(text, "normxlogit", target=(predicted, second))
    assert_scores(contrast.scores, norms * (logits[:, predicted] - logits[:, second]).numpy())


@pytest.mark.parametrize(("family", "task", "token"), [("bert", "masked_lm", "film"), ("gpt2", "causal_lm", " the")])
def test_token_given_as_text(family, task, token):
    model = cached_model(family, task)
    text = lm_text(model, task)
    token_id = model.tokenizer(token, add_special_tokens=False)["input_ids"]
    assert len(token_id) == 1, "pick a token that is one piece in the tiny vocabulary"
    ids, logits, hs = hf_states(model, text)
    e = model.explain(text, "logat", target=token)
    assert e.target.indices == token_id
    assert_scores(e.scores, logits[:, token_id[0]].numpy())


# --------------------------------------------------------------------------- layer-wise


LAYER_CASES = [
    ("bert", "classification"),
    ("roberta", "classification"),
    ("gpt2", "classification"),
    ("opt", "classification"),
    ("llama", "classification"),
    ("bert", "masked_lm"),
    ("gpt2", "causal_lm"),
    ("qwen2", "causal_lm"),
]


@pytest.mark.parametrize(("family", "task"), LAYER_CASES)
def test_layerwise_rows(family, task):
    model = cached_model(family, task)
    hf = model.hf_model
    text = lm_text(model, task) if task != "classification" else TEXTS[0]
    ids, logits, hs = hf_states(model, text)
    layers = len(hs) - 1
    flat = model.explain(text, "normxlogit")
    e = model.explain(text, "normxlogit", layerwise=True)
    assert e.layerwise and e.scores.shape == (layers, len(ids))
    np.testing.assert_allclose(e.scores[-1], flat.scores, atol=1e-6, rtol=1e-5)
    # row 0 = layer 1: the head on hidden_states[1], after the final norm for pre-LN decoders
    column = flat.target.indices[0]
    h1 = hs[1][0]
    norms = hs[0][0].norm(dim=-1).numpy()
    with torch.no_grad():
        if family in DECODERS:
            normed = final_norm(family, hf)(h1)
            if task == "causal_lm":
                expected = hf.lm_head(normed)[:, column].numpy()
            else:
                expected = hf.score(normed)[:, column].numpy()
            unnormed = (hf.lm_head(h1) if task == "causal_lm" else hf.score(h1))[:, column].numpy()
            assert np.abs(expected - unnormed).max() > 1e-3, "the final norm must matter here"
        elif task == "masked_lm":
            expected = hf.cls(h1)[:, column].numpy()
        else:
            expected = direct_logat(family, model, h1, column)
    assert_scores(e.scores[0], norms * expected)
    assert np.abs(e.scores[0] - e.scores[-1]).max() > 1e-3
    logat = model.explain(text, "logat", layerwise=True)
    np.testing.assert_allclose(logat.scores * norms[None, :], e.scores, atol=1e-5, rtol=1e-5)


def test_an_unknown_regression_rank_is_a_one_line_error():
    model = cached_model("bert", "regression")
    for method in ("normxlogit", "logat"):
        with pytest.raises(InputError, match="regression_rank"):
            model.explain(TEXTS, method, regression_rank="middle")
