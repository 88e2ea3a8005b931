"""LIME and KernelSHAP: agreement with Captum on the same samples, sampling laws, batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from captum._utils.models.linear_model import SkLearnLinearRegression, SkLearnRidge
from captum.attr import KernelShap, Lime

from heedful.attribution import surrogate
from heedful.attribution._masks import features_of, score_samples
from heedful.engine.seeding import example_generators

TEXTS = ["a charming and often affecting journey", "the movie was dull and far too long"]


def _setup(model, texts):
    problem = model.prepare(texts)
    return problem, model.adapter, problem.batch, problem.target


def _captum_forward(adapter, batch, target, b):
    """Captum's view of example ``b``: inputs are its content-token ids ``[R, M]``; removed ones
    arrive as the baseline id and are put back among the special tokens."""
    features = features_of(batch, target)
    positions = features.positions[b, : int(features.counts[b])]
    n = int(batch.lengths[b])

    def forward(content_ids: torch.Tensor) -> torch.Tensor:
        rows = content_ids.shape[0]
        ids = batch.input_ids[b : b + 1, :n].repeat(rows, 1)
        ids[:, positions] = content_ids
        rows_target = target.select([b] * rows)
        fwd = adapter.forward(batch, rows_target.anchor, input_ids=ids, attention_mask=batch.attention_mask[b : b + 1, :n].repeat(rows, 1),
                              token_type_ids=None if batch.token_type_ids is None else batch.token_type_ids[b : b + 1, :n].repeat(rows, 1))
        return rows_target.output(fwd.logits, "probability")

    return forward, batch.input_ids[b : b + 1, positions], positions


def _replay(samples: torch.Tensor):
    """A Captum ``perturb_func`` that hands out our samples in order."""

    def perturb(original_inp, **kwargs):
        for row in samples:
            yield row[None].long()

    return perturb


@pytest.mark.parametrize("sampling", ["lime", "bernoulli"])
def test_lime_matches_captum_on_the_same_samples(tiny, sampling):
    model = tiny("bert")
    problem, adapter, batch, target = _setup(model, TEXTS)
    n_samples, width, alpha = 64, 0.25, 1.0
    ours = surrogate.lime(problem, n_samples=n_samples, sampling=sampling, kernel_width=width, alpha=alpha, seed=3)
    features = features_of(batch, target)
    keep = surrogate.lime_samples(features, n_samples, sampling, example_generators(batch, 3))
    mask_id = adapter.tokenizer.mask_token_id
    for b in range(len(batch)):
        m = int(features.counts[b])
        forward, inputs, positions = _captum_forward(adapter, batch, target, b)

        def similarity(original, perturbed, interpretable, m=m, **kwargs):
            d = 1.0 - float(interpretable.sum()) ** 0.5 / m**0.5
            return float(np.exp(-(d**2) / (2 * width**2)))

        lime = Lime(forward, interpretable_model=SkLearnRidge(alpha=alpha), similarity_func=similarity, perturb_func=_replay(keep[b, :, :m]))
        theirs = lime.attribute(inputs, baselines=mask_id, feature_mask=torch.arange(m)[None], n_samples=n_samples, perturbations_per_eval=n_samples)
        np.testing.assert_allclose(ours[b, positions].numpy(), theirs[0].numpy(), atol=2e-5, rtol=1e-3)


def test_kernel_shap_matches_captum_on_the_same_samples(tiny):
    model = tiny("bert")
    problem, adapter, batch, target = _setup(model, TEXTS)
    n_samples = 80
    ours = surrogate.kernel_shap(problem, n_samples=n_samples, seed=5)
    features = features_of(batch, target)
    keep = surrogate.shap_samples(features, n_samples, example_generators(batch, 5))
    mask_id = adapter.tokenizer.mask_token_id
    for b in range(len(batch)):
        m = int(features.counts[b])
        forward, inputs, positions = _captum_forward(adapter, batch, target, b)
        ks = KernelShap(forward)  # Captum's own Shapley-kernel weights and linear regression
        ks.perturb_func = _replay(keep[b, :, :m])
        assert isinstance(ks.interpretable_model, SkLearnLinearRegression)
        theirs = ks.attribute(inputs, baselines=mask_id, feature_mask=torch.arange(m)[None], n_samples=n_samples, perturbations_per_eval=n_samples)
        np.testing.assert_allclose(ours[b, positions].numpy(), theirs[0].numpy(), atol=2e-4, rtol=1e-2)


def test_shap_samples_follow_the_shapley_kernel():
    from heedful.attribution._masks import Features

    m = 6
    features = Features(torch.arange(m)[None], torch.ones(1, m, dtype=torch.bool), torch.tensor([m]))
    gen = torch.Generator().manual_seed(0)
    keep = surrogate.shap_samples(features, 20002, [gen])
    assert keep[0, 0].all() and not keep[0, 1].any()
    sizes = keep[0, 2:].sum(dim=1)
    k = torch.arange(1, m, dtype=torch.float64)
    expected = (m - 1) / (k * (m - k))
    expected /= expected.sum()
    observed = torch.bincount(sizes, minlength=m)[1:m].double() / sizes.shape[0]
    assert torch.allclose(observed, expected, atol=0.01)
    # members are uniform: every feature is kept about equally often
    per_feature = keep[0, 2:].double().mean(dim=0)
    assert (per_feature - 0.5).abs().max() < 0.02


def test_kernel_shap_is_nearly_efficient_and_near_exact_shapley(tiny):
    """Sum of attributions ~ f(x) - f(all removed) (the 10^6 weights); with many samples the
    values approach exact Shapley values, computed here by enumerating all coalitions."""
    from itertools import product
    from math import comb

    model = tiny("bert")
    problem, adapter, batch, target = _setup(model, ["great acting", "a dull plot"])
    scores = surrogate.kernel_shap(problem, n_samples=3000, seed=0)
    features = features_of(batch, target)
    for b in range(len(batch)):
        m = int(features.counts[b])
        subsets = torch.tensor(list(product([False, True], repeat=m)))
        one = problem.select([b])
        values = score_samples(one, features_of(one.batch, one.target), subsets[None])[0]
        lookup = {tuple(s.tolist()): float(v) for s, v in zip(subsets, values, strict=True)}
        exact = []
        for j in range(m):
            total = 0.0
            for s in lookup:
                if s[j]:
                    continue
                with_j = tuple(True if i == j else x for i, x in enumerate(s))
                k = sum(s)
                total += (lookup[with_j] - lookup[s]) / (m * comb(m - 1, k))
            exact.append(total)
        positions = features.positions[b, :m]
        got = scores[b, positions].double().numpy()
        full, empty = lookup[(True,) * m], lookup[(False,) * m]
        assert abs(got.sum() - (full - empty)) < 1e-4
        np.testing.assert_allclose(got, exact, atol=0.02)


def test_weighted_fit_matches_sklearn():
    from sklearn.linear_model import LinearRegression, Ridge

    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(2, 40, 5, generator=gen) < 0.5).double()
    y = torch.randn(2, 40, generator=gen, dtype=torch.float64)
    w = torch.rand(2, 40, generator=gen, dtype=torch.float64) + 0.1
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for alpha in (0.0, 1.0):
        coef, intercept = surrogate.weighted_linear_fit(x, y, w, valid, alpha)
        for b in range(2):
            m = int(valid[b].sum())
            ref = (Ridge(alpha=alpha) if alpha else LinearRegression()).fit(x[b, :, :m].numpy(), y[b].numpy(), sample_weight=w[b].numpy())
            np.testing.assert_allclose(coef[b, :m].numpy(), ref.coef_, atol=1e-10)
            np.testing.assert_allclose(float(intercept[b]), ref.intercept_, atol=1e-10)
            assert (coef[b, m:] == 0).all()


@pytest.mark.parametrize("method", ["lime", "kernel_shap", "rise"])
@pytest.mark.parametrize("family,task", [("bert", "classification"), ("gpt2", "causal_lm"), ("roberta", "masked_lm")])
def test_sampling_methods_are_seeded_batch_invariant_and_zero_on_specials(tiny, method, family, task):
    model = tiny(family, task)
    mask = model.tokenizer.mask_token if task == "masked_lm" else None
    texts = [t.replace(" often", f" {mask}") for t in TEXTS] if mask else TEXTS
    if mask:
        texts[1] = texts[1].replace("dull", mask)
    opts = {"n_masks": 16} if method == "rise" else {"n_samples": 16}
    together = model.explain(texts, method=method, seed=1, **opts)
    alone = model.explain(texts[1], method=method, seed=1, **opts)
    np.testing.assert_allclose(together[1].scores, alone.scores, atol=1e-5)
    again = model.explain(texts[1], method=method, seed=1, **opts)
    assert np.array_equal(again.scores, alone.scores)
    other = model.explain(texts[1], method=method, seed=2, **opts)
    assert not np.array_equal(other.scores, alone.scores)
    for e in together:
        assert all(s == 0 for s, sp in zip(e.scores, e.special, strict=True) if sp)
        if task == "masked_lm":  # the [MASK] being explained is never removed
            assert e.scores[e.target.anchor] == 0


def test_bad_options_raise_input_errors(tiny):
    import heedful

    model = tiny("bert")
    with pytest.raises(heedful.InputError):
        model.explain(TEXTS[0], method="lime", sampling="nope")
    with pytest.raises(heedful.InputError):
        model.explain(TEXTS[0], method="lime", kernel_width=0)
    with pytest.raises(heedful.InputError):
        model.explain(TEXTS[0], method="kernel_shap", n_samples=1)
    with pytest.raises(heedful.InputError):
        model.explain(TEXTS[0], method="rise", p_keep=1.5)
