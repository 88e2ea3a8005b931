"""Raw attention and attention rollout against Hugging Face's own attention probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cached_model
from tiny import DECODERS, FAMILIES

TEXTS = ["a charming and often affecting journey", "the movie was dull"]


def hf_attentions(model, text: str) -> tuple[torch.Tensor, ...]:
    """``L`` tensors ``[H, N, N]`` from transformers itself, for the text alone (no padding)."""
    enc = model.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.hf_model(**enc, output_attentions=True)
    return tuple(a[0] for a in out.attentions)


def anchor_of(family: str, n: int) -> int:
    return n - 1 if family in DECODERS else 0


def direct_rollout(attentions, start: int = 0) -> torch.Tensor:
    """Abnar & Zuidema: R = Abar_L ... Abar_start, Abar = rownorm(mean_h A + I), as a plain loop."""
    n = attentions[0].shape[-1]
    joint = torch.eye(n, dtype=torch.float64)
    for attn in attentions[start:]:
        a = attn.double().mean(dim=0) + torch.eye(n, dtype=torch.float64)
        for i in range(n):
            a[i] = a[i] / a[i].sum()
        joint = a @ joint
    return joint


@pytest.mark.parametrize("family", FAMILIES)
def test_raw_attention_is_the_anchor_row_of_the_last_layer(family):
    model = cached_model(family)
    explanations = model.explain(TEXTS, "raw_attention")
    for text, e in zip(TEXTS, explanations, strict=True):
        attns = hf_attentions(model, text)
        n = attns[0].shape[-1]
        anchor = anchor_of(family, n)
        assert e.target.anchor == anchor
        expected = attns[-1].mean(dim=0)[anchor].numpy()
        np.testing.assert_allclose(e.scores, expected, atol=1e-6)
        assert e.scores.sum() == pytest.approx(1.0, abs=1e-5)
        assert np.abs(e.scores - attns[0].mean(dim=0)[anchor].numpy()).max() > 1e-4  # not layer 0


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_raw_attention_layer_and_head(family):
    model = cached_model(family)
    attns = hf_attentions(model, TEXTS[0])
    anchor = anchor_of(family, attns[0].shape[-1])
    first = model.explain(TEXTS[0], "raw_attention", layer=0).scores
    np.testing.assert_allclose(first, attns[0].mean(dim=0)[anchor].numpy(), atol=1e-6)
    one_head = model.explain(TEXTS[0], "raw_attention", layer=-1, head=2).scores
    np.testing.assert_allclose(one_head, attns[-1][2, anchor].numpy(), atol=1e-6)
    assert np.abs(first - model.explain(TEXTS[0], "raw_attention").scores).max() > 1e-4


def test_decoder_attention_is_causal():
    model = cached_model("gpt2")
    attns = hf_attentions(model, TEXTS[0])
    # the last token sees everything; an earlier token sees nothing after it (sanity of the oracle)
    assert torch.all(attns[-1][:, 2, 3:] == 0)
    rollout = model.explain(TEXTS[0], "rollout").scores
    assert np.all(rollout > 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_equals_a_direct_loop(family):
    model = cached_model(family)
    explanations = model.explain(TEXTS, "rollout")  # padded batch
    for text, e in zip(TEXTS, explanations, strict=True):
        attns = hf_attentions(model, text)
        anchor = anchor_of(family, attns[0].shape[-1])
        expected = direct_rollout(attns)[anchor].numpy()
        np.testing.assert_allclose(e.scores, expected, atol=1e-6)
        assert e.scores.sum() == pytest.approx(1.0, abs=1e-5)  # rows stay stochastic
        # rollout is not just the last layer's attention
        assert np.abs(e.scores - attns[-1].mean(dim=0)[anchor].numpy()).max() > 1e-4


@pytest.mark.parametrize("family", ["roberta", "llama"])
def test_rollout_start_layer(family):
    model = cached_model(family)
    attns = hf_attentions(model, TEXTS[0])
    anchor = anchor_of(family, attns[0].shape[-1])
    last_only = model.explain(TEXTS[0], "rollout", start_layer=1).scores
    np.testing.assert_allclose(last_only, direct_rollout(attns, start=1)[anchor].numpy(), atol=1e-6)
    # one layer: rownorm(mean_h A + I), i.e. (A_mean + I) / 2 since rows of A sum to 1
    eye = np.eye(attns[0].shape[-1])[anchor]
    np.testing.assert_allclose(last_only, (attns[-1].mean(dim=0)[anchor].numpy() + eye) / 2, atol=1e-6)


def test_masked_lm_rollout_reads_the_mask_row():
    model = cached_model("bert", "masked_lm")
    text = f"the movie was {model.tokenizer.mask_token} and far too long"
    attns = hf_attentions(model, text)
    ids = model.tokenizer(text)["input_ids"]
    anchor = ids.index(model.tokenizer.mask_token_id)
    e = model.explain(text, "rollout")
    assert e.target.anchor == anchor
    np.testing.assert_allclose(e.scores, direct_rollout(attns)[anchor].numpy(), atol=1e-6)
