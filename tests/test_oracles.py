"""Independent oracles: each method against a plain-loop computation of its paper's equations.

The oracles share no code with heedful's methods: every text runs alone (no padding) through
the raw transformers model, gradients come from ``torch.autograd`` on that model's own outputs
(``output_attentions`` / ``output_hidden_states``), and the equations are written as explicit
Python loops over layers, heads and positions. heedful runs the same texts as one padded batch,
so padding, anchors and target resolution are checked on the way. ``ORACLES`` names, for every
registered method, the tests that check it independently (a peer library, a plain-loop
computation of its equations, or a property its paper proves); a test below fails when a
method has none.
"""

from __future__ import annotations

import ast
import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cached_model

import heedful

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
TOL = 1e-5
"""Every oracle comparison: ``max |heedful - oracle| <= TOL * max |oracle|``."""

ATTENTION_CASES = [
    ("bert", "classification"),
    ("bert", "regression"),
    ("bert", "masked_lm"),
    ("roberta", "classification"),
    ("distilbert", "masked_lm"),
    ("gpt2", "classification"),
    ("gpt2", "causal_lm"),
    ("llama", "causal_lm"),
    ("qwen2", "classification"),
]


def texts_for(model) -> list[str]:
    if model.task != "masked_lm":
        return TEXTS
    mask = model.tokenizer.mask_token
    return [f"a charming and often {mask} journey", f"the {mask} was dull", f"the plot is {mask} yet the actors are wonderful"]


def assert_matches(ours, oracle, what: str, tol: float = TOL, scale: float | None = None) -> None:
    """``max |ours - oracle| <= tol * scale`` (default ``max |oracle|``), the scale not zero."""
    ours, oracle = np.asarray(ours, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    assert ours.shape == oracle.shape, f"{what}: shapes {ours.shape} vs {oracle.shape}"
    scale = float(np.abs(oracle).max()) if scale is None else scale
    assert scale > 1e-8, f"{what}: the oracle is all zero, the comparison would prove nothing"
    diff = float(np.abs(ours - oracle).max())
    assert diff <= tol * scale, f"{what}: max diff {diff:.3g} at scale {scale:.3g}\nours   {ours}\noracle {oracle}"


class Alone:
    """One text run alone through the raw transformers model: its ids, the position whose output
    is explained (``anchor``), the explained class, and the explained logit as a function."""

    def __init__(self, model, text: str) -> None:
        self.hf, self.tok, self.task = model.hf_model, model.tokenizer, model.task
        enc = self.tok(text, return_tensors="pt", return_special_tokens_mask=True)
        self.ids, self.special = enc["input_ids"], enc["special_tokens_mask"][0].bool().tolist()
        self.n = self.ids.shape[1]
        if self.task == "masked_lm":
            self.anchor = int((self.ids[0] == self.tok.mask_token_id).nonzero()[0, 0])
        elif model.hf_model.config.is_encoder_decoder or self.task == "causal_lm" or not self.is_encoder:
            self.anchor = self.n - 1  # decoders read the last token
        else:
            self.anchor = 0  # encoders pool [CLS] / <s>
        with torch.no_grad():
            logits = self.logits(self.hf(input_ids=self.ids))
        self.label = 0 if self.task == "regression" else int(logits.argmax())

    @property
    def is_encoder(self) -> bool:
        return self.hf.config.model_type in ("bert", "distilbert", "roberta", "deberta-v2", "electra")

    def logits(self, out) -> torch.Tensor:
        """The output row explained ``[C]``: the pooled logits of a classifier, the anchor's row of an LM."""
        if self.task in ("masked_lm", "causal_lm"):
            return out.logits[0, self.anchor]
        return out.logits[0]

    def score(self, out) -> torch.Tensor:
        return self.logits(out)[self.label]

    def attention_gradients(self, hidden: bool = False):
        """``(A, dF/dA, h, dF/dh)``: per layer attention probabilities ``[H, N, N]`` and their
        gradients; with ``hidden`` the block inputs ``hidden_states[0..L-1]`` ``[N, D]`` and theirs."""
        # the model's weights are frozen: the graph starts at the word embeddings
        embeds = self.hf.get_input_embeddings()(self.ids).detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.hf(inputs_embeds=embeds, output_attentions=True, output_hidden_states=hidden)
            attentions = list(out.attentions)
            inputs = list(out.hidden_states[: len(attentions)]) if hidden else []
            grads = torch.autograd.grad(self.score(out), attentions + inputs)
        a = [t[0].detach().double() for t in attentions]
        h = [t[0].detach().double() for t in inputs]
        g = [t[0].double() for t in grads]
        return a, g[: len(a)], h, g[len(a) :]


def explain(model, method: str, **options):
    """heedful's explanations of the model's texts, in one padded batch."""
    found = model.explain(texts_for(model), method, **options)
    return found, [Alone(model, t) for t in texts_for(model)]


def check_each(model, method: str, oracle, **options) -> None:
    """heedful's scores of every text against ``oracle(Alone)``, to :data:`TOL` of the largest
    oracle score over the texts (a positive-part method may give one text all zeros)."""
    found, alone = explain(model, method, **options)
    expected = [oracle(one) for one in alone]
    scale = max(float(np.abs(e).max()) for e in expected)
    for expl, one, exp in zip(found, alone, expected, strict=True):
        assert len(expl.tokens) == one.n
        if one.task != "regression":
            assert expl.target.indices[0] == one.label, "heedful explains another class than the oracle"
        assert_matches(expl.scores, exp, f"{method} {model.name} {expl.text!r}", scale=scale)


# =========================================================================== attention x gradient


def gae_oracle(one: Alone) -> np.ndarray:
    """Chefer et al. 2021b Eq. 5-6: ``Abar = E_h[(grad A . A)^+]``, ``R <- R + Abar R`` from ``R = I``."""
    a, g, _, _ = one.attention_gradients()
    n = one.n
    r = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for attn, grad in zip(a, g, strict=True):
        heads = attn.shape[0]
        bar = [[sum(max(0.0, float(grad[h, i, j] * attn[h, i, j])) for h in range(heads)) / heads for j in range(n)] for i in range(n)]
        r = [[r[i][j] + sum(bar[i][k] * r[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    row = list(r[one.anchor])
    row[one.anchor] = 0.0
    return np.array(row)


def grad_sam_oracle(one: Alone) -> np.ndarray:
    """Barkan et al. 2021 Eq. 2-3: ``s_j = 1/(L H n) sum_{l,h,i} A_l[h,i,j] ReLU(dF/dA_l[h,i,j])``."""
    a, g, _, _ = one.attention_gradients()
    n, layers, heads = one.n, len(a), a[0].shape[0]
    out = np.zeros(n)
    for j in range(n):
        total = 0.0
        for attn, grad in zip(a, g, strict=True):
            for h in range(heads):
                for i in range(n):
                    total += float(attn[h, i, j]) * max(0.0, float(grad[h, i, j]))
        out[j] = total / (layers * heads * n)
    return out


def attcat_oracle(one: Alone) -> np.ndarray:
    """Qiang et al. 2022 Eq. 6-7 (their code: ``hidden_states[l]`` of the blocks, attention
    averaged over heads and query rows): ``s_j = sum_l (sum_d dF/dh_l[j,d] h_l[j,d]) a_l[j]``."""
    a, _, h, gh = one.attention_gradients(hidden=True)
    n, heads = one.n, a[0].shape[0]
    out = np.zeros(n)
    for layer in range(len(a)):
        for j in range(n):
            cat = sum(float(gh[layer][j, d] * h[layer][j, d]) for d in range(h[layer].shape[1]))
            received = sum(float(a[layer][hd, i, j]) for hd in range(heads) for i in range(n)) / (heads * n)
            out[j] += cat * received
    return out


def cam_oracle(one: Alone) -> np.ndarray:
    """Song et al. 2024's CAM baseline (generate_gradcam): ``max(0, mean_{h,i} dF/dA_L[h,i,j])``,
    the anchor's entry 0."""
    _, g, _, _ = one.attention_gradients()
    last, n = g[-1], one.n
    heads = last.shape[0]
    out = np.array([max(0.0, sum(float(last[h, i, j]) for h in range(heads) for i in range(n)) / (heads * n)) for j in range(n)])
    out[one.anchor] = 0.0
    return out


def attention_gradcam_oracle(one: Alone) -> np.ndarray:
    """Chefer et al. 2021a's GradCAM on attention (generate_attn_gradcam): ``w_h = mean_{i,j}
    dF/dA_L[h]``, ``G = max(0, mean_h w_h A_L[h])`` min-max normalised, the anchor row, self 0."""
    a, g, _, _ = one.attention_gradients()
    attn, grad, n = a[-1], g[-1], one.n
    heads = attn.shape[0]
    w = [sum(float(grad[h, i, j]) for i in range(n) for j in range(n)) / (n * n) for h in range(heads)]
    cells = [[max(0.0, sum(w[h] * float(attn[h, i, j]) for h in range(heads)) / heads) for j in range(n)] for i in range(n)]
    low, high = min(min(r) for r in cells), max(max(r) for r in cells)
    # an all-zero map (every head weight negative) stays zero: the reference code divides 0 by 0 there
    row = [(v - low) / (high - low) if high > low else 0.0 for v in cells[one.anchor]]
    row[one.anchor] = 0.0
    return np.array(row)


ATTENTION_ORACLES = {
    "gae": gae_oracle,
    "grad_sam": grad_sam_oracle,
    "attcat": attcat_oracle,
    "cam": cam_oracle,
    "attention_gradcam": attention_gradcam_oracle,
}


@pytest.mark.parametrize(("family", "task"), ATTENTION_CASES)
@pytest.mark.parametrize("method", list(ATTENTION_ORACLES))
def test_attention_gradient_methods_equal_their_plain_loops(method, family, task):
    check_each(cached_model(family, task), method, ATTENTION_ORACLES[method])


# =========================================================================== SmoothGrad


@pytest.fixture()
def drawn_noise(monkeypatch):
    """Every noise tensor SmoothGrad draws ``[B, n_samples, N, E]``, in call order (the method
    still draws it; the oracle takes the same draws)."""
    from heedful.attribution import gradient

    draws: list[torch.Tensor] = []
    original = gradient._noise

    def recording(*args, **kwargs):
        noise = original(*args, **kwargs)
        draws.append(noise.clone())
        return noise

    monkeypatch.setattr(gradient, "_noise", recording)
    return draws


def smoothgrad_oracle(one: Alone, noise: torch.Tensor, nt_type: str, multiply_by_inputs: bool) -> np.ndarray:
    """Smilkov et al. 2017 Eq. 3 as a loop over the draws ``z_k`` ``[K, n, E]``: the gradient of
    the explained logit at ``e + z_k``, then the mean (or the mean of squares, or the variance:
    Captum's NoiseTunnel), times ``e`` with ``multiply_by_inputs``; per token the L2 norm of a
    bare mean gradient, the signed sum otherwise."""
    e = one.hf.get_input_embeddings()(one.ids)[0].detach()
    grads = []
    for z in noise:
        x = (e + z.to(e.dtype))[None].requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(one.score(one.hf(inputs_embeds=x)), x)
        grads.append(g[0].double())
    k, n, dim = len(grads), one.n, e.shape[1]
    out = np.zeros(n)
    for j in range(n):
        values = []
        for d in range(dim):
            draws = [float(g[j, d]) for g in grads]
            mean = sum(draws) / k
            if nt_type == "smoothgrad":
                v = mean
            elif nt_type == "smoothgrad_sq":
                v = sum(x * x for x in draws) / k
            else:
                v = sum((x - mean) ** 2 for x in draws) / k
            values.append(v * float(e[j, d]) if multiply_by_inputs else v)
        bare = nt_type == "smoothgrad" and not multiply_by_inputs
        out[j] = math.sqrt(sum(v * v for v in values)) if bare else sum(values)
    return out


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("roberta", "masked_lm"), ("gpt2", "causal_lm"), ("llama", "classification")])
@pytest.mark.parametrize(
    ("nt_type", "multiply_by_inputs"), [("smoothgrad", False), ("smoothgrad", True), ("smoothgrad_sq", False), ("vargrad", False)]
)
def test_smoothgrad_equals_a_loop_over_the_same_noise(drawn_noise, family, task, nt_type, multiply_by_inputs):
    model = cached_model(family, task)
    options = {"n_samples": 4, "noise_level": 0.2, "seed": 3, "nt_type": nt_type, "multiply_by_inputs": multiply_by_inputs}
    found, alone = explain(model, "smoothgrad", **options)
    (noise,) = drawn_noise
    assert noise.abs().max() > 0
    expected = [smoothgrad_oracle(one, noise[b, :, : one.n], nt_type, multiply_by_inputs) for b, one in enumerate(alone)]
    scale = max(float(np.abs(e).max()) for e in expected)
    for expl, exp in zip(found, expected, strict=True):
        assert_matches(expl.scores, exp, f"smoothgrad {nt_type} {model.name} {expl.text!r}", scale=scale)
    # and the noise is no zero-noise special case: the scores differ from saliency
    if nt_type == "smoothgrad" and not multiply_by_inputs:
        plain = model.explain(texts_for(model)[0], "saliency").scores
        assert np.abs(found[0].scores - plain).max() > 1e-3 * scale


def test_smoothgrad_noise_follows_its_law(drawn_noise):
    """Draws: N(0, sigma_b^2) with ``sigma_b = noise_level (max e_b - min e_b)`` over the real
    tokens, none on padding, the same for a text whatever its batch, another seed other draws."""
    model = cached_model("bert")
    model.explain(TEXTS, "smoothgrad", n_samples=64, noise_level=0.15, seed=5)
    model.explain(TEXTS[1], "smoothgrad", n_samples=64, noise_level=0.15, seed=5)
    model.explain(TEXTS[1], "smoothgrad", n_samples=64, noise_level=0.15, seed=6)
    batched, alone, other = drawn_noise
    for b, text in enumerate(TEXTS):
        one = Alone(model, text)
        e = one.hf.get_input_embeddings()(one.ids)[0].detach().double()
        sigma = 0.15 * float(e.max() - e.min())
        real = batched[b, :, : one.n].double()
        assert abs(float(real.std()) / sigma - 1) < 0.03 and abs(float(real.mean())) < 0.03 * sigma
        assert not batched[b, :, one.n :].any()  # no noise on padding
    n = Alone(model, TEXTS[1]).n
    # the same draws: float32 log and cos may round an ulp apart in another tensor's layout
    torch.testing.assert_close(alone[0, :, :n], batched[1, :, :n], rtol=1e-6, atol=1e-6)
    assert not torch.equal(other[0, :, :n], alone[0, :, :n])


# =========================================================================== RISE


def fixed_masks(counts: list[int], n_masks: int, p_keep: float, seed: int) -> list[np.ndarray]:
    """The test's own sampler: per example ``[n_masks, M_b]`` 0/1 keep-masks from numpy."""
    rng = np.random.default_rng(seed)
    return [(rng.random((n_masks, m)) < p_keep) for m in counts]


def rise_oracle(one: Alone, keep: np.ndarray, p_keep: float, output: str) -> np.ndarray:
    """Petsiuk et al. 2018 Eq. 6 over tokens, as a loop over the masks: ``S_j = 1/(S p)
    sum_s f(x . m_s) m_s[j]`` with ``f`` the explained class's probability (or logit). Removed
    tokens become [MASK] (encoders) or are deleted (decoders, which then read their last token;
    nothing left: the one-token input BOS/pad); special tokens and a [MASK] being explained stay."""
    ids = one.ids[0].tolist()
    removable = [p for p in range(one.n) if not one.special[p] and not (one.task == "masked_lm" and p == one.anchor)]
    assert keep.shape[1] == len(removable), "heedful and the oracle disagree on which tokens are removable"
    scores = np.zeros(one.n)
    for mask in keep:
        dropped = {p for p, kept in zip(removable, mask, strict=True) if not kept}
        if one.is_encoder:
            new = [one.tok.mask_token_id if p in dropped else t for p, t in enumerate(ids)]
            anchor = one.anchor
        else:
            new = [t for p, t in enumerate(ids) if p not in dropped]
            if not new:
                new = [one.tok.bos_token_id if one.tok.bos_token_id is not None else one.tok.pad_token_id]
            anchor = len(new) - 1
        with torch.no_grad():
            out = one.hf(input_ids=torch.tensor([new]))
        row = out.logits[0, anchor] if one.task in ("masked_lm", "causal_lm") else out.logits[0]
        if output == "probability" and one.task != "regression":
            row = torch.softmax(row.double(), dim=-1)
        y = float(row[one.label])
        for p, kept in zip(removable, mask, strict=True):
            scores[p] += y * float(kept)
    return scores / (len(keep) * p_keep)


@pytest.mark.parametrize(
    ("family", "task", "output"),
    [
        ("bert", "classification", "probability"),
        ("bert", "regression", "probability"),
        ("bert", "masked_lm", "probability"),
        ("roberta", "classification", "logit"),
        ("gpt2", "classification", "probability"),
        ("gpt2", "causal_lm", "probability"),
        ("llama", "causal_lm", "logit"),
    ],
)
def test_rise_equals_a_loop_over_fixed_masks(monkeypatch, family, task, output):
    from heedful.attribution import rise

    n_masks, p_keep = 12, 0.4
    given: list[np.ndarray] = []

    def fixed(batch, features, n, p, seed):
        given.extend(fixed_masks(features.counts.tolist(), n, p, seed=7))
        keep = torch.zeros(len(batch), n, features.width, dtype=torch.bool)
        for b, masks in enumerate(given):
            keep[b, :, : masks.shape[1]] = torch.from_numpy(masks)
        return keep

    monkeypatch.setattr(rise, "draw_masks", fixed)
    model = cached_model(family, task)
    found, alone = explain(model, "rise", n_masks=n_masks, p_keep=p_keep, output=output)
    expected = [rise_oracle(one, masks, p_keep, output) for one, masks in zip(alone, given, strict=True)]
    scale = max(float(np.abs(e).max()) for e in expected)
    for expl, exp in zip(found, expected, strict=True):
        assert_matches(expl.scores, exp, f"rise {model.name} {expl.text!r}", scale=scale)


def test_rise_draws_each_token_kept_with_probability_p_keep():
    """The method's own sampler: keep rates near ``p_keep``, masks seeded per text (same in any
    batch), another seed other masks."""
    from heedful.attribution import rise
    from heedful.attribution._masks import features_of

    model = cached_model("bert")
    problem = model.prepare(TEXTS)
    features = features_of(problem.batch, problem.target)
    keep = rise.draw_masks(problem.batch, features, 4000, 0.3, seed=1)
    for b, m in enumerate(features.counts.tolist()):
        assert abs(float(keep[b, :, :m].double().mean()) - 0.3) < 0.01
        assert not keep[b, :, m:].any()
    alone = model.prepare(TEXTS[1])
    again = rise.draw_masks(alone.batch, features_of(alone.batch, alone.target), 4000, 0.3, seed=1)
    m = int(features.counts[1])
    assert torch.equal(again[0, :, :m], keep[1, :, :m])
    other = rise.draw_masks(alone.batch, features_of(alone.batch, alone.target), 4000, 0.3, seed=2)
    assert not torch.equal(other[0, :, :m], keep[1, :, :m])


# =========================================================================== LRP rollouts (BERT, GPT-2; float64)


@pytest.fixture(scope="module")
def float64():
    """``float64(family, task)``: the tiny model in float64: the z-rule divides by products of
    mixed-sign operands, which amplifies float32 rounding far past 1e-5 (see
    test_relevance_rules.test_chefer_rules_match_explicit_bert_relprop)."""
    from tiny import tiny_model

    models = {}

    def get(family: str, task: str):
        if (family, task) not in models:
            model = tiny_model(family, task, initializer_range=0.2)
            model.hf_model.double()
            models[family, task] = model
        return models[family, task]

    return get


def relprop_maps(one: Alone, renormalise: bool) -> list[torch.Tensor]:
    """``R_A`` ``[H, n, n]`` per layer by Chefer et al.'s relprop written out layer by layer
    (BERT: tests/test_relevance_rules.py; GPT-2: :func:`gpt2_relprop_maps`; methods spec 1.1):
    renormalised additions for Chefer's rules, plain z-rule additions for the original LRP of
    PartialLRP."""
    from test_relevance_rules import _bert_relprop

    if one.hf.config.model_type == "gpt2":
        return [m.double() for m in gpt2_relprop_maps(one.hf, one.ids, one.label, renormalise)]
    _, maps = _bert_relprop(one.hf, one.ids, one.label, renormalise)
    return [m[0].double() for m in maps]


def chefer_oracle(one: Alone) -> np.ndarray:
    """Chefer et al. 2021a Eq. 13-14: ``Abar_l = E_h[(grad A_l . R_A_l)^+]``, ``M_l = norm_rows(Abar_l
    + I)``, ``C = M_L ... M_1``; the anchor row of ``C``, self-entry 0."""
    _, g, _, _ = one.attention_gradients()
    maps, n = relprop_maps(one, renormalise=True), one.n
    joint = None
    for grad, rel in zip(g, maps, strict=True):
        heads = rel.shape[0]
        m = [[sum(max(0.0, float(grad[h, i, j] * rel[h, i, j])) for h in range(heads)) / heads + (i == j) for j in range(n)] for i in range(n)]
        m = [[v / sum(row) for v in row] for row in m]
        joint = m if joint is None else [[sum(m[i][k] * joint[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    row = list(joint[one.anchor])
    row[one.anchor] = 0.0
    return np.array(row)


def partial_lrp_oracle(one: Alone) -> np.ndarray:
    """Voita et al. 2019 as PartialLRP in Chefer et al. 2021a (generate_LRP_last_layer):
    ``E_h[(R_A_L)^+]`` of the last layer under the original LRP rules, anchor row, self-entry 0."""
    rel, n = relprop_maps(one, renormalise=False)[-1], one.n
    heads = rel.shape[0]
    row = [sum(max(0.0, float(rel[h, one.anchor, j])) for h in range(heads)) / heads for j in range(n)]
    row[one.anchor] = 0.0
    return np.array(row)


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("bert", "regression"), ("gpt2", "classification")])
@pytest.mark.parametrize(("method", "oracle"), [("chefer", chefer_oracle), ("partial_lrp", partial_lrp_oracle)])
def test_lrp_rollouts_equal_explicit_relprop_and_plain_loops(float64, method, oracle, family, task):
    check_each(float64(family, task), method, oracle)


# =========================================================================== random


def test_random_scores_are_uniform_and_seeded_per_text():
    """The random baseline's law: U[0, 1) on every real token, the same for a text in any batch."""
    from scipy.stats import kstest
    from tiny import CORPUS

    model = cached_model("bert")
    texts = sorted(set(CORPUS))
    found = model.explain(texts, "random", seed=4)
    pooled = np.concatenate([e.scores for e in found])
    assert ((pooled >= 0) & (pooled < 1)).all() and kstest(pooled, "uniform").pvalue > 1e-3
    assert np.array_equal(model.explain(texts[3], "random", seed=4).scores, found[3].scores)
    assert not np.array_equal(model.explain(texts[3], "random", seed=5).scores, found[3].scores)


# =========================================================================== occlusion


def occlusion_oracle(one: Alone, window: int, stride: int) -> np.ndarray:
    """Zeiler & Fergus 2014's occlusion over tokens as a plain loop: windows of ``window``
    removable tokens (not special, not a masked LM's ``[MASK]``) starting every ``stride`` of them,
    the last cut at the end (Captum's ``Occlusion``); each window replaced by ``[MASK]``
    (encoders) or deleted (decoders, which then read their new last token); a token's score the
    mean drop of the explained logit over the windows that hold it, 0 for the others."""
    removable = [i for i in range(one.n) if not one.special[i] and not (one.task == "masked_lm" and i == one.anchor)]
    count = math.ceil(max(len(removable) - window, 0) / stride) + 1
    ids = one.ids[0]

    def explained(kept: torch.Tensor) -> float:
        out = one.hf(input_ids=kept[None])
        if one.task == "causal_lm":
            return float(out.logits[0, -1, one.label])
        return float(one.score(out))

    with torch.no_grad():
        full = explained(ids)
        totals, counts = np.zeros(one.n), np.zeros(one.n)
        for k in range(count):
            occluded = removable[k * stride : k * stride + window]
            if one.is_encoder:
                kept = ids.clone()
                kept[occluded] = one.tok.mask_token_id
            else:
                kept = torch.tensor([t for i, t in enumerate(ids.tolist()) if i not in occluded])
            drop = full - explained(kept)
            for i in occluded:
                totals[i] += drop
                counts[i] += 1
    return np.divide(totals, counts, out=np.zeros(one.n), where=counts > 0)


@pytest.mark.parametrize(("window", "stride"), [(3, 2), (2, 1), (4, 4)])
@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("bert", "masked_lm"), ("llama", "classification"), ("gpt2", "causal_lm")])
def test_occlusion_equals_a_plain_loop_over_its_windows(family, task, window, stride):
    check_each(cached_model(family, task), "occlusion", functools.partial(occlusion_oracle, window=window, stride=stride), window=window, stride=stride)


def test_occlusion_equals_captum_occlusion_on_the_content_tokens():
    """Captum's ``Occlusion`` sliding over a BERT classifier's content tokens (``[CLS]`` and
    ``[SEP]`` put back around every perturbed copy), ``[MASK]`` as the baseline; and window 1 is
    leave-one-out, exactly."""
    from captum.attr import Occlusion

    model = cached_model("bert")
    found = model.explain(TEXTS, "occlusion", window=3, stride=2)
    for expl, text in zip(found, TEXTS, strict=True):
        one = Alone(model, text)
        content = one.ids[:, 1:-1]
        ends = one.ids[:, :1], one.ids[:, -1:]

        def forward(middle: torch.Tensor, hf=one.hf, ends=ends) -> torch.Tensor:
            rows = middle.shape[0]
            return hf(input_ids=torch.cat([ends[0].expand(rows, 1), middle, ends[1].expand(rows, 1)], dim=1)).logits

        with torch.no_grad():
            theirs = Occlusion(forward).attribute(content, sliding_window_shapes=(3,), strides=2, baselines=one.tok.mask_token_id, target=one.label)
        assert_matches(expl.scores[1:-1], theirs[0].numpy(), f"occlusion {text!r}")
        assert expl.scores[0] == expl.scores[-1] == 0
    for a, b in zip(model.explain(TEXTS, "occlusion", window=1), model.explain(TEXTS, "leave_one_out"), strict=True):
        assert np.array_equal(a.scores, b.scores)


def test_occlusion_refuses_a_stride_past_its_window_in_one_line():
    with pytest.raises(heedful.InputError, match="stride=3 is larger than window=2") as refused:
        cached_model("bert").explain(TEXTS[0], "occlusion", window=2, stride=3)
    assert refused.value.hint and "\n" not in str(refused.value.message)


# =========================================================================== windowed gradient norm


def gradient_norm_window_oracle(one: Alone, window: int) -> np.ndarray:
    """The L2 norm of ``d f / d e_j`` by ``torch.autograd`` on the raw model's forward from its
    word embeddings, then for each token ``i`` the plain mean of those norms over the positions
    ``i - (window - 1) // 2 .. i + window // 2`` that exist in the text."""
    embeds = one.hf.get_input_embeddings()(one.ids).detach().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(one.score(one.hf(inputs_embeds=embeds)), embeds)
    norms = [float(torch.linalg.vector_norm(grad[0, j].double())) for j in range(one.n)]
    scores = np.zeros(one.n)
    for i in range(one.n):
        held = [norms[j] for j in range(i - (window - 1) // 2, i + window // 2 + 1) if 0 <= j < one.n]
        scores[i] = sum(held) / len(held)
    return scores


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("bert", "masked_lm"), ("llama", "classification"), ("gpt2", "causal_lm")])
def test_gradient_norm_window_equals_a_plain_loop_over_autograd_norms(family, task, window):
    check_each(cached_model(family, task), "gradient_norm_window", functools.partial(gradient_norm_window_oracle, window=window), window=window)


# =========================================================================== every method has one

ORACLES: dict[str, tuple[str, ...]] = {
    # vector methods: the papers' equations layer by layer / a direct computation
    "alti": ("test_decomposition_methods.py::test_alti_equals_the_papers_equations_layer_by_layer",),
    "alti_logit": ("test_decomposition_methods.py::test_alti_logit_equals_the_reference_algorithm",),
    "decompx": (
        "test_decomposition_methods.py::test_decompx_equals_the_reference_algorithm_on_bert",
        "test_decomposition_methods.py::test_decompx_scores_sum_to_every_logit_of_every_family_and_head",
    ),
    "embedding_norm": ("test_vector_methods.py::test_logat_and_embedding_norm",),
    "globenc": ("test_decomposition_methods.py::test_globenc_equals_the_papers_equations_layer_by_layer",),
    "logat": ("test_vector_methods.py::test_logat_and_embedding_norm",),
    "normxlogit": ("test_vector_methods.py::test_normxlogit_equals_direct_head_computation",),
    "value_zeroing": ("test_decomposition_methods.py::test_value_zeroing_equals_zeroing_one_token_at_a_time",),
    # gradients: Captum, completeness, a loop over the same noise
    "grad_x_input": ("test_gradient_methods.py::test_saliency_and_grad_x_input_equal_captum",),
    "saliency": ("test_gradient_methods.py::test_saliency_and_grad_x_input_equal_captum",),
    "gradient_norm_window": ("test_oracles.py::test_gradient_norm_window_equals_a_plain_loop_over_autograd_norms",),
    "integrated_gradients": (
        "test_gradient_methods.py::test_integrated_gradients_equal_captum",
        "test_gradient_methods.py::test_integrated_gradients_completeness",
    ),
    "smoothgrad": ("test_oracles.py::test_smoothgrad_equals_a_loop_over_the_same_noise",),
    # attention
    "raw_attention": ("test_attention_methods.py::test_raw_attention_is_the_anchor_row_of_the_last_layer",),
    "rollout": ("test_attention_methods.py::test_rollout_equals_a_direct_loop",),
    "gae": ("test_oracles.py::test_attention_gradient_methods_equal_their_plain_loops",),
    "grad_sam": ("test_oracles.py::test_attention_gradient_methods_equal_their_plain_loops",),
    "attcat": ("test_oracles.py::test_attention_gradient_methods_equal_their_plain_loops",),
    "cam": ("test_oracles.py::test_attention_gradient_methods_equal_their_plain_loops",),
    "attention_gradcam": ("test_oracles.py::test_attention_gradient_methods_equal_their_plain_loops",),
    # relevance propagation: an explicit relprop, lxt, conservation
    "chefer": ("test_oracles.py::test_lrp_rollouts_equal_explicit_relprop_and_plain_loops",),
    "partial_lrp": ("test_oracles.py::test_lrp_rollouts_equal_explicit_relprop_and_plain_loops",),
    "lrp": (
        "test_relevance_rules.py::test_chefer_rules_match_explicit_bert_relprop",
        "test_relevance_methods.py::test_lrp_conserves_the_seed_and_contrasts_sum_to_zero",
    ),
    "attnlrp": ("test_relevance_rules.py::test_attnlrp_matches_lxt",),
    "mask_lrp": (
        "test_relevance_rules.py::test_literal_mask_lrp_matches_explicit_masked_bert_relprop",
        "test_relevance_methods.py::test_literal_mask_lrp_rollout_against_a_plain_loop_over_eq_10_11",
        "test_relevance_rules.py::test_literal_mask_lrp_conserves_relevance_through_every_block",
    ),
    # perturbation
    "coperturbation": (
        "test_coperturbation.py::test_paper_objective_equals_a_hand_computation_of_eq_9",
        "test_coperturbation.py::test_optimum_of_the_normalised_objective_is_found",
    ),
    "guan2019": ("test_coperturbation.py::test_guan2019_is_the_same_optimiser_with_reference_settings",),
    "individual_perturbation": ("test_perturbation_tdd.py::test_individual_perturbation_noises_one_token_at_a_time",),
    "shapley_interactions": (
        "test_interactions.py::test_shapley_interactions_with_every_coalition_equal_the_exact_indices",
        "test_interactions.py::test_shapley_interactions_sampled_stay_within_their_sampling_error_of_the_exact_indices",
    ),
    "kernel_shap": (
        "test_perturbation_surrogate.py::test_kernel_shap_matches_captum_on_the_same_samples",
        "test_perturbation_surrogate.py::test_kernel_shap_is_nearly_efficient_and_near_exact_shapley",
    ),
    "leave_one_out": ("test_gradient_methods.py::test_leave_one_out_equals_captum_feature_ablation",),
    "occlusion": (
        "test_oracles.py::test_occlusion_equals_a_plain_loop_over_its_windows",
        "test_oracles.py::test_occlusion_equals_captum_occlusion_on_the_content_tokens",
    ),
    "lime": ("test_perturbation_surrogate.py::test_lime_matches_captum_on_the_same_samples",),
    "rise": ("test_oracles.py::test_rise_equals_a_loop_over_fixed_masks",),
    "reagent": ("test_reagent.py::test_reagent_equals_a_plain_loop_over_the_update_rule_and_stopping_test",),
    "solvability_beam": (
        "test_solvability.py::test_solvability_beam_finds_the_brute_force_optimum_when_the_beam_holds_every_ordering",
        "test_solvability.py::test_solvability_beam_of_one_is_the_greedy_search",
        "test_solvability.py::test_solvability_beam_with_a_shortlist_is_the_lazy_greedy_search",
        "test_solvability.py::test_a_refresh_measures_every_token_left_again_every_few_steps",
    ),
    "tdd": ("test_perturbation_tdd.py::test_tdd_matches_the_reference_on_gpt2",),
    # context
    "at2": (
        "test_at2.py::test_head_features_are_the_attention_of_the_target_rows_summed_per_source",
        "test_at2.py::test_scores_are_the_weighted_sum_of_the_head_features",
        "test_at2.py::test_the_learned_weights_reproduce_the_training_objective_by_hand",
    ),
    "context_cite": ("test_context.py::test_context_cite_with_every_mask_equals_an_exact_least_squares_fit",),
    "hierarchical": ("test_context.py::test_hierarchical_leaves_out_the_top_sources_exactly_and_ranks_the_rest_below_them",),
    "source_loo": ("test_context.py::test_source_loo_with_and_without_the_cache_equals_removing_each_source_by_hand",),
    # baseline
    "random": ("test_oracles.py::test_random_scores_are_uniform_and_seeded_per_text",),
}
"""Method name -> the tests (``file::function``, in tests/) that check it independently."""


def _default_suite_tests(path: Path) -> set[str]:
    """The test functions of a test file that run in the default suite (not marked slow/skip)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            marks = {ast.unparse(d) for d in node.decorator_list}
            if not any("mark.slow" in m or "mark.skip" in m for m in marks):
                found.add(node.name)
    return found


def test_every_registered_method_has_an_oracle_test():
    registered = {info.name for info in heedful.methods()}
    assert set(ORACLES) == registered, (
        f"methods without an oracle: {sorted(registered - set(ORACLES))}; not registered: {sorted(set(ORACLES) - registered)}"
    )
    tests = Path(__file__).parent
    for method, names in ORACLES.items():
        assert names, f"{method} names no oracle test"
        for name in names:
            file, function = name.split("::")
            assert function in _default_suite_tests(tests / file), f"{method}: {name} is not a default-suite test"


@torch.no_grad()
def gpt2_relprop_maps(hf, ids: torch.Tensor, label: int, renormalise: bool) -> list[torch.Tensor]:
    """``R_A`` ``[H, n, n]`` per layer by the rules of Chefer et al.'s relprop (methods spec 1.1)
    written out for a GPT-2 classifier: pre-LN blocks, Conv1D linears (alpha=1, beta=0 on each of
    Q, K, V's columns of ``c_attn``), LayerNorm / GELU / causal softmax as identity, halved z-rule
    products, z-rule (renormalised for Chefer's rules) residual additions, the relevance starting
    at the last token's ``score`` row."""
    from test_relevance_rules import _add, _halves, _lin

    tr, n = hf.transformer, ids.shape[1]
    dim, heads = hf.config.n_embd, hf.config.n_head
    d = dim // heads
    split = lambda t: t.view(1, n, heads, d).transpose(1, 2)  # noqa: E731
    merge = lambda t: t.transpose(1, 2).reshape(1, n, dim)  # noqa: E731
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    h = tr.wte(ids) + tr.wpe(torch.arange(n))[None]
    saved = []
    for blk in tr.h:
        x = blk.ln_1(h)
        q, k, v = (split(t) for t in blk.attn.c_attn(x).split(dim, dim=-1))
        logits = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ctx = merge(probs @ v)
        a = blk.attn.c_proj(ctx)
        h1 = h + a
        y = blk.ln_2(h1)
        f = blk.mlp.act(blk.mlp.c_fc(y))
        m = blk.mlp.c_proj(f)
        saved.append((h, x, q, k, v, probs, ctx, a, h1, y, f, m))
        h = h1 + m
    last = tr.ln_f(h)[:, n - 1]
    rel = torch.zeros(1, hf.config.num_labels, dtype=h.dtype)
    rel[0, label] = 1.0
    rel_h = torch.zeros_like(h)
    rel_h[:, n - 1] = _lin(rel, last, hf.score.weight)
    maps = []
    for index in reversed(range(len(saved))):
        blk, (h, x, q, k, v, probs, ctx, a, h1, y, f, m) = tr.h[index], saved[index]
        rel_m, rel_h1 = _add(rel_h, m, h1, renormalise)
        rel_h1 = rel_h1 + _lin(_lin(rel_m, f, blk.mlp.c_proj.weight.T), y, blk.mlp.c_fc.weight.T)
        rel_a, rel_res = _add(rel_h1, a, h, renormalise)
        rel_ctx = split(_lin(rel_a, ctx, blk.attn.c_proj.weight.T))
        rel_probs, rel_v = _halves(rel_ctx, probs, v)
        maps.insert(0, rel_probs[0])
        rel_q, rel_kt = _halves(rel_probs, q, k.transpose(-1, -2))
        w = blk.attn.c_attn.weight  # [D, 3D]: Q, K, V columns
        parts = (rel_q, rel_kt.transpose(-1, -2), rel_v)
        rel_h = rel_res + sum(_lin(merge(r), x, w[:, i * dim : (i + 1) * dim].T) for i, r in enumerate(parts))
    return maps
