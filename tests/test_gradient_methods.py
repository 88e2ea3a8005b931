"""Gradient and perturbation methods against first principles and against Captum (test-only oracle).

heedful runs on a padded batch of texts; the oracles run on each text alone, straight through the
transformers model, so padding, anchors and target resolution are checked on the way.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from captum.attr import (
    FeatureAblation,
    InputXGradient,
    IntegratedGradients,
    LayerIntegratedGradients,
    Saliency,
)
from conftest import INIT_RANGE, cached_model
from tiny import CORPUS, ENCODERS, FAMILIES, tiny_model

import heedful
from heedful.attribution.gradient import baseline_embeddings, path_points

pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
CAPTUM_CASES = [(f, "classification") for f in FAMILIES] + [
    ("bert", "masked_lm"),
    ("deberta-v2", "masked_lm"),
    ("gpt2", "causal_lm"),
    ("llama", "causal_lm"),
    ("bert", "regression"),
    ("opt", "regression"),
]


def texts_for(model, task: str) -> list[str]:
    if task != "masked_lm":
        return TEXTS
    mask = model.tokenizer.mask_token
    return [f"a charming and often {mask} journey", f"the {mask} was dull"]


class Oracle:
    """One text run alone through the Hugging Face model: its ids, anchor and target column."""

    def __init__(self, model, task: str, text: str) -> None:
        self.hf, self.tok, self.task = model.hf_model, model.tokenizer, task
        enc = self.tok(text, return_special_tokens_mask=True, return_tensors="pt")
        self.ids = enc["input_ids"]
        self.special = enc["special_tokens_mask"][0].bool()
        n = self.ids.shape[1]
        if task == "masked_lm":
            self.anchor = int((self.ids[0] == self.tok.mask_token_id).nonzero()[0, 0])
        elif task == "causal_lm":
            self.anchor = n - 1
        else:
            self.anchor = None  # HF pools by itself ([CLS] / last token)
        with torch.no_grad():
            logits = self.logits_from_ids(self.ids)
        self.target = 0 if task == "regression" else int(logits[0].argmax())

    def _at_anchor(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.anchor is None else logits[:, self.anchor]

    def logits_from_embeds(self, embeds: torch.Tensor) -> torch.Tensor:
        return self._at_anchor(self.hf(inputs_embeds=embeds).logits)

    def logits_from_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self._at_anchor(self.hf(input_ids=ids).logits)

    @property
    def embeds(self) -> torch.Tensor:
        return self.hf.get_input_embeddings()(self.ids).detach()

    def pad_baseline(self) -> torch.Tensor:
        pad = self.tok.pad_token_id
        ids = torch.where(self.special[None], self.ids, torch.full_like(self.ids, pad))
        return self.hf.get_input_embeddings()(ids).detach()


def assert_close_to_scale(ours: np.ndarray, theirs: np.ndarray, rel: float = 1e-5) -> None:
    """``max |ours - theirs| <= rel * max(1, max |theirs|)``, and the oracle is not all zero."""
    scale = float(np.abs(theirs).max())
    assert scale > 1e-3, "oracle attributions are all ~0: the comparison would prove nothing"
    diff = float(np.abs(ours - theirs).max())
    assert diff <= rel * max(1.0, scale), f"max diff {diff:.3g} at scale {scale:.3g}"


# --------------------------------------------------------------------------- Captum: gradients


@pytest.mark.parametrize(("family", "task"), CAPTUM_CASES)
def test_saliency_and_grad_x_input_equal_captum(family, task):
    model = cached_model(family, task)
    texts = texts_for(model, task)
    oracles = [Oracle(model, task, t) for t in texts]
    targets = [o.target for o in oracles]
    # explain every text in one padded batch with each text's own target (predicted by default)
    sal = [e.scores for e in model.explain(texts, "saliency")]
    gxi = [e.scores for e in model.explain(texts, "grad_x_input")]
    assert [e.target.indices[0] for e in model.explain(texts, "saliency")] == targets
    for o, ours_sal, ours_gxi in zip(oracles, sal, gxi, strict=True):
        grad = Saliency(o.logits_from_embeds).attribute(o.embeds, target=o.target, abs=False)
        assert_close_to_scale(ours_sal, grad[0].norm(dim=-1).numpy())
        ixg = InputXGradient(o.logits_from_embeds).attribute(o.embeds, target=o.target)
        assert_close_to_scale(ours_gxi, ixg[0].sum(dim=-1).detach().numpy())


@pytest.mark.parametrize(("family", "task"), CAPTUM_CASES)
def test_integrated_gradients_equal_captum(family, task):
    n_steps = 16
    model = cached_model(family, task)
    texts = texts_for(model, task)
    ours = [e.scores for e in model.explain(texts, "integrated_gradients", n_steps=n_steps)]
    for text, mine in zip(texts, ours, strict=True):
        o = Oracle(model, task, text)
        ig = IntegratedGradients(o.logits_from_embeds).attribute(
            o.embeds, baselines=o.pad_baseline(), target=o.target, n_steps=n_steps, method="gausslegendre"
        )
        assert_close_to_scale(mine, ig[0].sum(dim=-1).detach().numpy())


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("gpt2", "classification"), ("roberta", "masked_lm")])
def test_integrated_gradients_equal_captum_layer_integrated_gradients(family, task):
    """The form the benchmark times: LayerIntegratedGradients on the word-embedding layer, with
    baseline *ids* (content tokens -> pad, special tokens kept)."""
    model = cached_model(family, task)
    text = texts_for(model, task)[0]
    o = Oracle(model, task, text)
    baseline_ids = torch.where(o.special[None], o.ids, torch.full_like(o.ids, model.tokenizer.pad_token_id))
    lig = LayerIntegratedGradients(o.logits_from_ids, model.hf_model.get_input_embeddings())
    theirs = lig.attribute(o.ids, baselines=baseline_ids, target=o.target, n_steps=20, method="gausslegendre")
    mine = model.explain(text, "integrated_gradients", n_steps=20, baseline="pad").scores
    assert_close_to_scale(mine, theirs[0].sum(dim=-1).detach().numpy())


@pytest.mark.parametrize("rule", ["riemann_left", "riemann_right", "riemann_middle"])
def test_integrated_gradients_rules_equal_captum(rule):
    # not riemann_trapezoid: Captum 0.9 weights its n points 1/n (halved at the ends), which sum to
    # (n-1)/n; heedful's weights sum to 1 (checked by test_path_weights_sum_to_one and completeness)
    model = cached_model("gpt2")
    o = Oracle(model, "classification", TEXTS[0])
    mine = model.explain(TEXTS[0], "integrated_gradients", target=o.target, n_steps=8, rule=rule).scores
    ig = IntegratedGradients(o.logits_from_embeds).attribute(
        o.embeds, baselines=o.pad_baseline(), target=o.target, n_steps=8, method=rule
    )
    assert_close_to_scale(mine, ig[0].sum(dim=-1).detach().numpy())


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_trapezoid", "riemann_left", "riemann_right", "riemann_middle"])
def test_path_weights_sum_to_one(rule):
    alphas, weights = path_points(7, rule)
    assert len(alphas) == len(weights) == 7
    assert np.all((alphas >= 0) & (alphas <= 1)) and np.all(np.diff(alphas) > 0)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    # exact for polynomials of low degree: integral_0^1 a^2 da = 1/3
    assert (weights * alphas**2).sum() == pytest.approx(1 / 3, abs=0.1 if rule.startswith("riemann") else 1e-12)


def test_integrated_gradients_chunking_does_not_change_scores():
    model = cached_model("bert")
    whole = model.explain(TEXTS, "integrated_gradients", n_steps=10)
    chunked = model.explain(TEXTS, "integrated_gradients", n_steps=10, internal_batch_size=3)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- completeness


@functools.cache
def completeness_model(family: str):
    """The cached tiny model, except Llama: its pad row is initialised to zero (``padding_idx``),
    so the pad baseline is the zero vector, and with no position embeddings RMSNorm makes
    ``f(alpha * x)`` jump for ``alpha`` below ~1e-2 (no fixed quadrature converges). A real
    Llama's pad token (its EOS) has a trained, non-zero embedding; give the tiny one a random one."""
    if family != "llama":
        return cached_model(family)
    model = tiny_model("llama", initializer_range=INIT_RANGE)
    emb = model.hf_model.get_input_embeddings().weight
    with torch.no_grad():
        emb[model.tokenizer.pad_token_id] = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(1)) * INIT_RANGE
    return model


@pytest.mark.parametrize(
    ("family", "baseline", "rule"),
    [
        ("bert", "pad", "gausslegendre"),
        ("bert", "zero", "gausslegendre"),
        ("bert", "mask", "gausslegendre"),
        ("bert", "pad", "riemann_trapezoid"),
        ("roberta", "pad", "gausslegendre"),
        ("gpt2", "pad", "gausslegendre"),
        ("llama", "pad", "gausslegendre"),
    ],
)
def test_integrated_gradients_completeness(family, baseline, rule):
    """sum_i IG_i = f(x) - f(x') within 1 % at 300 steps (Sundararajan et al. 2017, Prop. 1)."""
    model = completeness_model(family)
    texts = CORPUS[:4]
    diff = output_change(model, texts, baseline)
    assert np.abs(diff).max() > 0.05, "pick texts whose output moves between baseline and input"
    explanations = model.explain(texts, "integrated_gradients", n_steps=300, baseline=baseline, rule=rule)
    totals = np.array([e.scores.sum() for e in explanations])
    rel = np.abs(totals - diff) / np.maximum(np.abs(diff), 1e-2)
    assert rel.max() < 0.01, f"completeness off by {rel.max():.2%}: sums {totals}, f(x)-f(x') {diff}"


def output_change(model, texts: list[str], baseline: str) -> np.ndarray:
    """``f(x) - f(x')`` of the predicted-class logit, straight from the adapter's forward on the
    word embeddings and on the baseline embeddings."""
    problem = model.prepare(texts)
    with torch.no_grad():
        f_x = problem.target.score(problem.forward(inputs_embeds=problem.word_embeddings()).logits)
        f_base = problem.target.score(problem.forward(inputs_embeds=baseline_embeddings(problem, baseline)).logits)
    return (f_x - f_base).numpy()


def test_integrated_gradients_few_steps_are_not_complete():
    """The completeness check above can fail: at 1 step the sum is visibly off."""
    model = completeness_model("llama")
    texts = CORPUS[:4]
    diff = output_change(model, texts, "pad")
    one = np.array([e.scores.sum() for e in model.explain(texts, "integrated_gradients", n_steps=1)])
    assert (np.abs(one - diff) / np.maximum(np.abs(diff), 1e-2)).max() > 0.05


# --------------------------------------------------------------------------- SmoothGrad limits


def test_smoothgrad_without_noise_is_saliency():
    model = cached_model("roberta")
    sal = model.explain(TEXTS, "saliency")
    smooth = model.explain(TEXTS, "smoothgrad", n_samples=3, noise_level=0.0)
    smooth_x = model.explain(TEXTS, "smoothgrad", n_samples=2, noise_level=0.0, multiply_by_inputs=True)
    gxi = model.explain(TEXTS, "grad_x_input")
    for a, b, c, d in zip(sal, smooth, smooth_x, gxi, strict=True):
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(c.scores, d.scores, atol=1e-6, rtol=1e-5)
    noisy = model.explain(TEXTS[0], "smoothgrad", n_samples=3, noise_level=0.2)
    assert np.abs(noisy.scores - sal[0].scores).max() > 1e-4


# --------------------------------------------------------------------------- leave-one-out


@pytest.mark.parametrize(("family", "task"), [(f, "classification") for f in ENCODERS] + [("bert", "masked_lm")])
def test_leave_one_out_equals_captum_feature_ablation(family, task):
    model = cached_model(family, task)
    texts = texts_for(model, task)
    ours = model.explain(texts, "leave_one_out")
    mask_id = model.tokenizer.mask_token_id
    for text, mine in zip(texts, ours, strict=True):
        o = Oracle(model, task, text)
        n = o.ids.shape[1]
        with torch.no_grad():
            theirs = FeatureAblation(o.logits_from_ids).attribute(
                o.ids, baselines=mask_id, target=o.target,
                feature_mask=torch.arange(n)[None], perturbations_per_eval=n,
            )[0].numpy()
        content = (~o.special).numpy().copy()
        if o.anchor is not None:  # the masked position being predicted is never removed
            content[o.anchor] = False
            assert mine.scores[o.anchor] == 0
        assert_close_to_scale(mine.scores[content], theirs[content])
        assert np.all(mine.scores[~content] == 0), "special tokens are not removed"


@pytest.mark.parametrize(("family", "task"), [("gpt2", "classification"), ("llama", "classification"), ("gpt2", "causal_lm")])
def test_leave_one_out_deletes_tokens_in_decoders(family, task):
    model = cached_model(family, task)
    texts = TEXTS
    ours = model.explain(texts, "leave_one_out")
    for text, mine in zip(texts, ours, strict=True):
        o = Oracle(model, task, text)
        ids = o.ids[0]
        assert not o.special.any()  # no special tokens: every position is removable

        def f(kept: torch.Tensor, column: int = o.target) -> float:
            logits = model.hf_model(input_ids=kept[None]).logits  # HF reads the last token itself
            return float(logits[0, -1, column] if task == "causal_lm" else logits[0, column])

        with torch.no_grad():
            full = f(ids)
            expected = np.array([full - f(torch.cat([ids[:i], ids[i + 1 :]])) for i in range(len(ids))])
        assert_close_to_scale(mine.scores, expected)


def test_leave_one_out_probability_output():
    model = cached_model("distilbert")
    o = Oracle(model, "classification", TEXTS[0])

    def probs(ids):
        return torch.softmax(model.hf_model(input_ids=ids).logits, dim=-1)

    n = o.ids.shape[1]
    with torch.no_grad():
        theirs = FeatureAblation(probs).attribute(
            o.ids, baselines=model.tokenizer.mask_token_id, target=o.target,
            feature_mask=torch.arange(n)[None], perturbations_per_eval=n,
        )[0].numpy()
    mine = model.explain(TEXTS[0], "leave_one_out", output="probability").scores
    content = (~o.special).numpy()
    assert_close_to_scale(mine[content], theirs[content])


def test_gauss_legendre_beyond_its_feasible_steps_is_refused_before_any_work(tiny):
    """n_steps=400,000 with the default Gauss-Legendre rule: its nodes would be the eigenvalues of
    a 400,000 x 400,000 matrix (numpy's leggauss; 1.3 TB, a MemoryError after the model was
    loaded). Refused in one line naming the largest n_steps and the Riemann rules, when the work
    is estimated -- before any pass -- and by path_points itself; a Riemann rule takes as many."""
    from heedful.attribution.gradient import GAUSS_LEGENDRE_MAX_STEPS

    model = tiny("bert")
    for attempt in (
        lambda: model.estimate("a charming journey", "integrated_gradients", n_steps=400_000),
        lambda: model.explain("a charming journey", "integrated_gradients", n_steps=400_000),
        lambda: path_points(GAUSS_LEGENDRE_MAX_STEPS + 1, "gausslegendre"),
    ):
        with pytest.raises(heedful.InputError, match=r"n_steps=[\d,]+ with rule=gausslegendre") as caught:
            attempt()
        assert f"n_steps <= {GAUSS_LEGENDRE_MAX_STEPS:,}" in caught.value.hint and "riemann_trapezoid" in caught.value.hint
        assert "--option" in caught.value.cli_hint
    assert len(path_points(GAUSS_LEGENDRE_MAX_STEPS, "gausslegendre")[0]) == GAUSS_LEGENDRE_MAX_STEPS
    assert model.estimate("a charming journey", "integrated_gradients", n_steps=400_000, rule="riemann_trapezoid").forward > 400_000
