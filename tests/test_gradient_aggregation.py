"""The ``aggregate`` option of the gradient methods: per-dimension attributions computed directly
on the transformers model, reduced by hand, against heedful's token scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cached_model

import heedful
from heedful.attribution.gradient import (
    AGGREGATES,
    GRADIENT_AGGREGATES,
    aggregate_embedding,
    path_points,
)

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
REDUCE = {
    "sum": lambda a: a.sum(dim=-1),
    "l1": lambda a: a.abs().sum(dim=-1),
    "l2": lambda a: a.pow(2).sum(dim=-1).sqrt(),
}


class Direct:
    """One text alone through the Hugging Face classifier: gradients of the predicted logit
    with respect to its word embeddings ``[N, E]``."""

    def __init__(self, model, text: str) -> None:
        self.hf, self.tok = model.hf_model, model.tokenizer
        enc = self.tok(text, return_special_tokens_mask=True, return_tensors="pt")
        self.ids, self.special = enc["input_ids"], enc["special_tokens_mask"][0].bool()
        self.embed = self.hf.get_input_embeddings()
        self.embeds = self.embed(self.ids).detach()
        with torch.no_grad():
            self.target = int(self.hf(input_ids=self.ids).logits[0].argmax())

    def grad(self, embeds: torch.Tensor) -> torch.Tensor:
        embeds = embeds.detach().requires_grad_(True)
        logit = self.hf(inputs_embeds=embeds).logits[0, self.target]
        return torch.autograd.grad(logit, embeds)[0][0]

    def per_dimension(self, method: str, n_steps: int = 8) -> torch.Tensor:
        """``[N, E]``: gradient, gradient x input, or integrated gradients (Eq. 1 of Sundararajan
        et al., Gauss-Legendre points, [PAD] baseline on content tokens) before any reduction."""
        if method in ("saliency", "smoothgrad"):
            return self.grad(self.embeds)
        if method == "grad_x_input":
            return self.grad(self.embeds) * self.embeds[0]
        pad = torch.where(self.special[None], self.ids, torch.full_like(self.ids, self.tok.pad_token_id))
        base = self.embed(pad).detach()
        delta = self.embeds - base
        alphas, weights = path_points(n_steps, "gausslegendre")
        total = sum(float(w) * self.grad(base + float(a) * delta) for a, w in zip(alphas, weights, strict=True))
        return total * delta[0]


ACCEPTS = {
    "saliency": GRADIENT_AGGREGATES,
    "grad_x_input": AGGREGATES,
    "integrated_gradients": AGGREGATES,
    "smoothgrad": GRADIENT_AGGREGATES,  # without multiply_by_inputs
}
OPTIONS = {
    "saliency": {},
    "grad_x_input": {},
    "integrated_gradients": {"n_steps": 8},
    "smoothgrad": {"noise_level": 0.0, "n_samples": 2},  # no noise: the mean gradient is the gradient
}


@pytest.mark.parametrize("aggregate", AGGREGATES)
@pytest.mark.parametrize("method", list(OPTIONS))
def test_aggregate_reduces_the_per_dimension_attributions(method, aggregate):
    if aggregate not in ACCEPTS[method]:
        pytest.skip(f"{method} takes no {aggregate}")
    model = cached_model("bert")
    found = model.explain(TEXTS, method, aggregate=aggregate, **OPTIONS[method])
    for text, expl in zip(TEXTS, found, strict=True):
        direct = Direct(model, text)
        expected = REDUCE[aggregate](direct.per_dimension(method)).numpy()
        assert expl.target.indices[0] == direct.target
        assert expl.options.get("aggregate", aggregate) == aggregate
        np.testing.assert_allclose(expl.scores, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("method", ["grad_x_input", "integrated_gradients"])
def test_l1_is_not_the_signed_sum(method):
    """The l1 norm loses the sign and cancellation the default sum keeps (so the test above tells them apart)."""
    model = cached_model("bert")
    signed = model.explain(TEXTS[0], method, **OPTIONS[method]).scores
    l1 = model.explain(TEXTS[0], method, aggregate="l1", **OPTIONS[method]).scores
    assert (l1 >= np.abs(signed) - 1e-6).all()
    assert (l1 - np.abs(signed)).max() > 1e-3


def test_smoothgrad_multiplied_by_inputs_aggregates_the_product():
    model = cached_model("bert")
    direct = Direct(model, TEXTS[1])
    product = direct.grad(direct.embeds) * direct.embeds[0]
    for aggregate in (None, *AGGREGATES):
        options = {} if aggregate is None else {"aggregate": aggregate}
        scores = model.explain(TEXTS[1], "smoothgrad", multiply_by_inputs=True, **OPTIONS["smoothgrad"], **options).scores
        expected = REDUCE[aggregate or "sum"](product).numpy()
        np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize(
    ("method", "default"),
    [("saliency", "l2"), ("grad_x_input", "sum"), ("integrated_gradients", "sum"), ("smoothgrad", "l2")],
)
def test_defaults_are_unchanged(method, default):
    model = cached_model("bert")
    implicit = model.explain(TEXTS[0], method, **OPTIONS[method]).scores
    explicit = model.explain(TEXTS[0], method, aggregate=default, **OPTIONS[method]).scores
    np.testing.assert_array_equal(implicit, explicit)


@pytest.mark.parametrize("method", list(OPTIONS))
@pytest.mark.parametrize("value", ["l3", "L1", "mean", None, 1])
def test_unknown_aggregate_fails_before_any_work(method, value):
    model = cached_model("bert")
    if method == "smoothgrad" and value is None:
        return  # None is smoothgrad's "its own default"
    before = model.adapter.counter.forward
    with pytest.raises(heedful.InputError) as info:
        model.explain(TEXTS[0], method, aggregate=value, **OPTIONS[method])
    assert "aggregate" in info.value.message
    assert all(repr(name) in info.value.message for name in ACCEPTS[method])
    assert model.adapter.counter.forward == before


def test_bare_gradient_takes_no_signed_sum():
    """Its signed sum is no token score (0 under an embedding LayerNorm): a clear error instead."""
    model = cached_model("bert")
    for options in ({}, {"noise_level": 0.0, "n_samples": 2}):
        method = "smoothgrad" if options else "saliency"
        with pytest.raises(heedful.InputError) as info:
            model.explain(TEXTS[0], method, aggregate="sum", **options)
        assert "aggregate" in info.value.message and "'l1'" in info.value.message
    scores = model.explain(TEXTS[0], "smoothgrad", aggregate="sum", multiply_by_inputs=True, **OPTIONS["smoothgrad"]).scores
    assert np.abs(scores).max() > 1e-3


def test_unknown_aggregate_fails_when_called_directly():
    with pytest.raises(heedful.InputError) as info:
        aggregate_embedding(torch.ones(1, 2, 3), "max")
    assert "max" in info.value.message and "l1" in info.value.hint


def test_causal_lm_l1():
    """Decoders too: l1 of gradient x input is the abs-sum of the per-dimension products."""
    model = cached_model("gpt2", "causal_lm")
    expl = model.explain(TEXTS[1], "grad_x_input", aggregate="l1")
    ids = model.tokenizer(TEXTS[1], return_tensors="pt")["input_ids"]
    embeds = model.hf_model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model.hf_model(inputs_embeds=embeds).logits[0, -1]
    grad = torch.autograd.grad(logits[expl.target.indices[0]], embeds)[0][0]
    expected = (grad * embeds[0]).abs().sum(dim=-1).detach().numpy()
    np.testing.assert_allclose(expl.scores, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
