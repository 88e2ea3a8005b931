"""Co-perturbation interest estimation (and Guan et al. 2019's settings): the objective's optimum,
seeding and batch invariance, padding, layers, options and errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from tiny import tiny_model

import heedful
from heedful.attribution import coperturbation as cp
from heedful.attribution.noise import HEAD, NoiseProbe

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
FAST = {"max_steps": 12, "samples": 2}


@pytest.fixture(scope="module")
def sharp() -> heedful.Model:
    """A tiny BERT with larger weights, so that noise on the input visibly moves its output."""
    return tiny_model("bert", initializer_range=0.2)


def _resolved(model, texts, target=None):
    problem = model.prepare(texts, target)
    return problem, problem.batch, problem.target


@dataclass
class QuadraticProbe:
    """A stand-in model whose distortion is ``sum_j c_j * mean_d eps_jd^2``: the normalised
    objective is then ``sum_j c_j sigma_j^2 - (lam / 2) mean_j ln sigma_j``, minimised at
    ``sigma_j^2 = lam / (4 n c_j)`` -- interest ``rho_j ~ sqrt(c_j)``."""

    c: torch.Tensor  # [B, N]
    dim: int = 16

    def distortion(self, example, key, noise, normalise=True):
        return (self.c[example, : noise.shape[1]] * noise.pow(2).mean(dim=-1)).sum(dim=1)


def test_optimum_of_the_normalised_objective_is_found(tiny):
    """Algorithm 1 with the Eq. 9 objective converges to the analytic optimum, for several
    sentences (different lengths) and lambdas optimised together."""
    model = tiny("bert")
    problem, batch, target = _resolved(model, TEXTS)
    lengths = batch.lengths
    gen = torch.Generator().manual_seed(0)
    c = torch.rand(batch.input_ids.shape, generator=gen) * 4 + 0.5
    probe = QuadraticProbe(c)
    example = torch.tensor([0, 0, 1])
    lam = torch.tensor([0.6, 2.0, 0.6])
    settings = cp.Settings(samples=8, max_steps=300, tol=0.0, scale=2.0, lr=0.1)
    fits = {keep: cp.fit_interest(problem, example, torch.full((3,), HEAD), lam, replace(settings, keep=keep), seed=0, probe=probe) for keep in ("last", "best")}
    fit = fits["last"]
    for p in range(3):
        e, n = int(example[p]), int(lengths[example[p]])
        expected = torch.sqrt(lam[p] / (4 * n * c[e, :n])).clamp(max=2.0)
        for keep, rtol in (("last", 0.12), ("best", 0.3)):  # the kept best draw is a noisier estimate
            got = fits[keep].sigma[p, :n]
            assert torch.allclose(got, expected, rtol=rtol), (keep, got, expected)
        assert (fit.sigma[p, n:] == 0).all()  # padding carries no noise
    # larger lambda -> more noise everywhere
    assert (fit.sigma[1, :7] > fit.sigma[0, :7]).all()


def test_seeded_deterministic_and_batch_invariant(sharp):
    together = sharp.explain(TEXTS, method="coperturbation", seed=0, **FAST)
    alone = sharp.explain(TEXTS[1], method="coperturbation", seed=0, **FAST)
    again = sharp.explain(TEXTS[1], method="coperturbation", seed=0, **FAST)
    other = sharp.explain(TEXTS[1], method="coperturbation", seed=1, **FAST)
    assert np.array_equal(alone.scores, again.scores)
    np.testing.assert_allclose(together[1].scores, alone.scores, atol=1e-4)
    assert not np.allclose(other.scores, alone.scores)
    assert alone.cost.backward_passes == FAST["max_steps"] * FAST["samples"]


def test_reference_pass_serves_as_the_clean_pass(sharp):
    """A problem prepared with hidden states hands its reference pass to the probe: the same
    scores as a problem whose clean pass runs again for them, one forward fewer."""
    plain, batch, _ = _resolved(sharp, TEXTS)
    adapter = sharp.adapter
    adapter.counter.reset()
    own = cp.coperturbation(plain, seed=0, **FAST)
    own_forwards = adapter.counter.forward
    with_hidden = sharp.prepare(TEXTS, hidden_states=True)
    adapter.counter.reset()
    given = cp.coperturbation(with_hidden, seed=0, **FAST)
    assert torch.equal(own, given)
    assert adapter.counter.forward == own_forwards - len(batch)
    alone = sharp.explain(TEXTS[0], method="coperturbation", seed=0, **FAST)
    np.testing.assert_allclose(alone.scores, own[0, : len(batch.tokens[0])].numpy(), atol=1e-6)


def test_scores_normalised_over_content_tokens(sharp):
    e = sharp.explain(TEXTS[0], method="coperturbation", seed=0, **FAST)
    content = ~np.array(e.special)
    assert np.isclose(e.scores[content].sum(), 1.0, atol=1e-5)
    assert (e.scores > 0).all()  # special tokens are noised too and keep a score
    log = sharp.explain(TEXTS[0], method="coperturbation", seed=0, score="log_rho", **FAST)
    np.testing.assert_allclose(np.exp(log.scores), e.scores, rtol=1e-5)
    raw = sharp.explain(TEXTS[0], method="coperturbation", seed=0, normalize=False, **FAST)
    np.testing.assert_allclose(raw.scores / raw.scores[content].sum(), e.scores, rtol=1e-5)


def test_padding_gets_no_noise_and_does_not_move_real_positions(sharp):
    problem, batch, _ = _resolved(sharp, TEXTS)
    probe = NoiseProbe.build(problem, (HEAD, 1))
    noise = torch.zeros(2, batch.seq_len, probe.dim)
    pad = ~batch.attention_mask.bool()
    noise[pad] = 5.0  # only padded positions of the short sentence
    for key in (HEAD, 1):
        d = probe.distortion(torch.arange(2), torch.full((2,), key), noise)
        assert d.abs().max() < 1e-6


def test_layerwise_rows_equal_single_layer_runs(sharp):
    layerwise = sharp.explain(TEXTS, method="coperturbation", seed=0, layerwise=True, **FAST)
    assert layerwise[0].scores.shape == (sharp.adapter.num_layers, len(layerwise[0].tokens))
    for k in (1, 2):
        single = sharp.explain(TEXTS, method="coperturbation", seed=0, layer=k, **FAST)
        for a, b in zip(layerwise, single, strict=True):
            np.testing.assert_allclose(a.scores[k - 1], b.scores, atol=1e-4)
    last = sharp.explain(TEXTS[0], method="coperturbation", seed=0, layer=-1, **FAST)
    np.testing.assert_allclose(last.scores, layerwise[0].scores[-1], atol=1e-4)


def test_guan2019_is_the_same_optimiser_with_reference_settings(sharp):
    guan = sharp.explain(TEXTS[0], method="guan2019", seed=0, rate=0.1, max_steps=30)
    same = sharp.explain(
        TEXTS[0], method="coperturbation", seed=0, lam=0.2, samples=1, max_steps=30, tol=0, lr=0.01, init="randn",
        scale_basis="word_embeddings", scale_factor=10,
    )
    np.testing.assert_allclose(guan.scores, same.scores, rtol=1e-6)
    info = heedful.get_method("guan2019")
    assert info.defaults["max_steps"] == 5000 and info.defaults["samples"] == 1 and info.defaults["rate"] == 0.1
    assert info.defaults["lr"] == 0.01 and cp.GUAN2019.init == "randn"  # the start is the reference's, not an option


@pytest.mark.parametrize("family,task", [("gpt2", "causal_lm"), ("llama", "classification"), ("roberta", "masked_lm"), ("distilbert", "regression")])
def test_every_task_and_space(tiny, family, task):
    model = tiny(family, task)
    text = TEXTS[0] if task != "masked_lm" else TEXTS[0].replace("often", model.tokenizer.mask_token)
    for space in ("embedding_output", "word_embeddings"):
        e = model.explain(text, method="coperturbation", seed=0, space=space, max_steps=5, samples=2)
        assert np.isfinite(e.scores).all() and e.scores.shape == (len(e.tokens),)


def test_contrastive_target_through_the_target_output(tiny):
    model = tiny("gpt2", "causal_lm")
    tokens = model.tokenizer.tokenize(" paris")
    tokens2 = model.tokenizer.tokenize(" film")
    target = f"{model.tokenizer.convert_tokens_to_string(tokens[:1])} vs {model.tokenizer.convert_tokens_to_string(tokens2[:1])}"
    e = model.explain("the capital of france is", method="coperturbation", target=target, output="target", seed=0, max_steps=5, samples=2)
    assert e.target.kind == "contrast" and np.isfinite(e.scores).all()


def test_fit_reports_steps_convergence_and_history(sharp):
    problem, batch, _ = _resolved(sharp, TEXTS)
    fit, shape = cp.estimate_interest(problem, layers=[None, 1], lams=[0.3, 0.6], settings=cp.Settings(max_steps=60, window=10, tol=0.5, samples=2))
    assert shape == (2, 2, 2) and fit.sigma.shape == (8, batch.seq_len)
    assert fit.converged.all() and (fit.steps == 20).all()  # a loose tol stops at the first check
    assert fit.history.shape == (20, 8) and torch.isfinite(fit.history).all()
    assert (fit.objective <= fit.history.min(dim=0).values + 1e-6).all()  # the best state is kept


@pytest.mark.parametrize(
    "options",
    [{"layer": 9}, {"layer": 0}, {"layer": 1, "layerwise": True}, {"score": "sigma"}, {"space": "pixels"}, {"output": "argmax"}, {"samples": 0}, {"lam": -1}, {"scale": 0}],
)
def test_bad_options_raise_input_errors(tiny, options):
    model = tiny("bert")
    with pytest.raises(heedful.InputError):
        model.explain(TEXTS[0], method="coperturbation", max_steps=2, **options)


def test_cli_explain_twice_gives_identical_scores(monkeypatch, capsys, tmp_path):
    from tiny import tiny_hf

    from heedful import cli

    hf_model, tokenizer = tiny_hf("bert")
    hf_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    found = []
    for _ in range(2):
        monkeypatch.setattr("sys.argv", ["heedful", "explain", TEXTS[0], "--model", str(tmp_path), "--method", "coperturbation", "--seed", "0", "--json", "-o", "max_steps=20"])
        try:
            cli.main()
        except SystemExit as exc:
            assert not exc.code
        found.append(json.loads(capsys.readouterr().out)["scores"])
    assert found[0] == found[1]



def test_zero_start_leaves_the_ranking_to_the_gradients(sharp):
    # after one step the kept (best) state is the starting state: equal for every token from 0,
    # the seeded N(0, 1) draw from "randn"
    start = sharp.explain(TEXTS[0], method="coperturbation", seed=0, max_steps=1, keep="best")
    content = ~np.asarray(start.special)
    np.testing.assert_allclose(start.scores[content], start.scores[content][0], rtol=1e-6)
    drawn = sharp.explain(TEXTS[0], method="coperturbation", seed=0, max_steps=1, keep="best", init="randn")
    assert np.ptp(drawn.scores[content]) > 0.01
    with pytest.raises(heedful.InputError, match="init"):
        sharp.explain(TEXTS[0], method="coperturbation", init="ones", max_steps=1)


# ------------------------------------------------------------------ objective="paper"
def test_paper_objective_equals_a_hand_computation_of_eq_9():
    """``objective="paper"``: ``J = mean_s ||phi(x) - phi(x + sqrt(sigma) z_s)||^2 - lambda (D/2)
    sum_j ln sigma_j`` with ``sigma_j`` the variance (paper Eq. 9, Appendix A.2), computed here
    with the Hugging Face model itself, token by token, for a given ``theta`` and given draws."""
    from tiny import tiny_hf

    hf, _ = tiny_hf("bert", initializer_range=0.2)
    model = tiny_model("bert", initializer_range=0.2)  # the same seeded weights
    problem = model.prepare(TEXTS, None, hidden_states=True)
    batch = problem.batch
    probe = NoiseProbe.build(problem, (HEAD,), space="word_embeddings")
    gen = torch.Generator().manual_seed(3)
    samples, seq, dim = 3, batch.seq_len, probe.dim
    theta = torch.randn(2, seq, generator=gen)
    z = torch.randn(2, samples, seq, dim, generator=gen)
    real = batch.attention_mask.bool()
    z = z * real[:, None, :, None]
    scale, lam = torch.tensor([0.7, 1.3]), torch.tensor([0.6, 2.0])
    j, dist = cp._objective(probe, torch.arange(2), torch.full((2,), HEAD), lam, theta, z, real, scale, "paper")

    hf.eval()
    for b in range(2):
        n = int(real[b].sum())
        ids = batch.input_ids[b : b + 1, :n]
        with torch.no_grad():
            clean = hf(input_ids=ids).logits[0]
            words = hf.get_input_embeddings()(ids)[0]
            total = 0.0
            for s in range(samples):
                noised = words.clone()
                for t in range(n):
                    variance = float(scale[b]) ** 2 / (1 + np.exp(-float(theta[b, t])))  # scale^2 sigmoid(theta)
                    noised[t] = words[t] + np.sqrt(variance) * z[b, s, t]
                out = hf(inputs_embeds=noised[None]).logits[0]
                total += float(((clean - out) ** 2).sum())
        expected_dist = total / samples
        entropy = sum(np.log(float(scale[b]) ** 2 / (1 + np.exp(-float(theta[b, t])))) for t in range(n))
        expected = expected_dist - float(lam[b]) * dim / 2 * entropy
        assert np.isclose(float(dist[b]), expected_dist, rtol=1e-4), (float(dist[b]), expected_dist)
        assert np.isclose(float(j[b]), expected, rtol=1e-4, atol=1e-3), (float(j[b]), expected)


def test_paper_objective_scores_invert_the_variance(sharp):
    """Interest under ``objective="paper"`` is ``1 / sigma_j`` with ``sigma_j`` the variance: the
    square of the std-based ``rho`` of the same fit, up to normalisation."""
    problem, batch, _ = _resolved(sharp, TEXTS[:1])
    settings = cp.Settings(objective="paper", lam=1e-3, max_steps=5, samples=2)
    fit, _ = cp.estimate_interest(problem, settings=settings, seed=0)
    scores = cp.coperturbation(problem, objective="paper", lam=1e-3, max_steps=5, samples=2, normalize=False)
    n = int(batch.lengths[0])
    np.testing.assert_allclose(scores[0, :n].numpy(), (1 / fit.sigma[0, :n] ** 2).numpy(), rtol=1e-5)


# ------------------------------------------------------------------ solver="linearized"
@dataclass
class LinearProbe:
    """``phi(x + eps) = phi(x) + A_e vec(eps)`` with an explicit matrix ``A`` ``[B, M, N, D]``: the
    expected distortion is then exactly quadratic in the noise variances."""

    A: torch.Tensor
    energy_value: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B]

    @property
    def dim(self) -> int:
        return self.A.shape[-1]

    @property
    def energy(self):
        return {HEAD: self.energy_value}

    def elements(self, example, key):
        return torch.full((example.shape[0],), self.A.shape[1])

    def change(self, example, key, noise):
        diff = torch.einsum("rmnd,rnd->rm", self.A[example][:, :, : noise.shape[1]], noise)
        return diff, torch.ones_like(diff, dtype=torch.bool)


def _linear_toy(sharp, outputs: int):
    problem, batch, _ = _resolved(sharp, TEXTS)
    gen = torch.Generator().manual_seed(1)
    seq = batch.seq_len
    A = torch.randn(2, outputs, seq, 6, generator=gen) * torch.rand(1, 1, seq, 1, generator=gen) * 2
    A = A * batch.attention_mask[:, None, :, None]
    return problem, batch, LinearProbe(A, torch.tensor([0.8, 2.5]), batch.lengths)


def _exact_optimum(A: np.ndarray, n: int, lam: float, objective: str, ceiling: float, energy: float) -> np.ndarray:
    """The minimiser over the variances of the exact expected objective of a linear ``phi``:
    ``E||A eps||^2 = trace(A Sigma A^T)`` with the full covariance ``Sigma = diag(sigma_j I_D)``,
    found by L-BFGS-B within the ceiling."""
    from scipy.optimize import minimize

    M, D = A.shape[0], A.shape[-1]
    flat = A[:, :n].reshape(M, n * D)

    def loss(log_var):
        cov = np.diag(np.repeat(np.exp(log_var), D))
        dist = np.trace(flat @ cov @ flat.T)
        if objective == "paper":
            return dist - lam * D / 2 * log_var.sum()
        return dist / (M * energy) - lam / 2 * np.mean(0.5 * log_var)  # (lambda/2) mean_j ln std_j

    start = np.full(n, np.log(ceiling) - 3)
    found = minimize(loss, start, method="L-BFGS-B", bounds=[(None, np.log(ceiling))] * n, options={"ftol": 1e-14, "gtol": 1e-10, "maxiter": 5000})
    return np.exp(found.x)


@pytest.mark.parametrize("objective,lam", [("paper", 0.05), ("paper", 2.0), ("normalised", 0.6)])
def test_linearized_solver_is_the_exact_optimum_for_a_linear_phi(sharp, objective, lam):
    problem, batch, probe = _linear_toy(sharp, outputs=3)
    ceiling = 1.5
    settings = cp.Settings(solver="linearized", objective=objective, scale=ceiling, probes=16)
    fit = cp.fit_interest(problem, torch.arange(2), torch.full((2,), HEAD), torch.full((2,), lam), settings, seed=0, probe=probe)
    for b in range(2):
        n = int(batch.lengths[b])
        want = _exact_optimum(probe.A[b].double().numpy(), n, lam, objective, ceiling**2, float(probe.energy_value[b]))
        np.testing.assert_allclose(fit.sigma[b, :n].double().numpy() ** 2, want, rtol=2e-3)
        assert (fit.sigma[b, n:] == 0).all()
    if objective == "paper" and lam == 2.0:
        assert (fit.sigma**2 >= ceiling**2 * (1 - 1e-6)).any()  # the ceiling binds somewhere


def test_hutchinson_estimate_converges_to_the_frobenius_norm(sharp):
    problem, batch, probe = _linear_toy(sharp, outputs=2000)
    exact = probe.A.pow(2).sum(dim=(1, 3))  # ||A_j||_F^2  [B, N]
    example, key = torch.arange(2), torch.full((2,), HEAD)

    def estimate(probes, seed):
        gens = cp.problem_generators(batch, example, key, seed)
        return cp.jacobian_sq_norms(problem, probe, example, key, probes, gens)

    errors = {}
    for k in (4, 64, 1600):
        found = estimate(k, 0)
        errors[k] = float((found - exact).abs().sum() / exact.sum())
    assert errors[1600] < 0.05 and errors[1600] < errors[64] < errors[4]
    mean = torch.stack([estimate(4, s) for s in range(100)]).mean(dim=0)  # unbiased
    assert float((mean - exact).abs().sum() / exact.sum()) < 0.05
    # M <= probes: the unit vectors, exact
    np.testing.assert_allclose(estimate(2000, 0).numpy(), exact.numpy(), rtol=1e-4, atol=1e-6)


def test_linearized_jacobian_norms_of_a_real_model_match_autograd(sharp):
    """The exact (unit-vector) path on the tiny BERT: ``||J_j||_F^2`` of the logits w.r.t. each
    word embedding, against ``torch.autograd.functional.jacobian`` of the Hugging Face model."""
    from tiny import tiny_hf

    hf, _ = tiny_hf("bert", initializer_range=0.2)
    hf.eval()
    problem, batch, _ = _resolved(sharp, TEXTS)
    probe = NoiseProbe.build(problem, (HEAD,), space="word_embeddings")
    example, key = torch.arange(2), torch.full((2,), HEAD)
    gens = cp.problem_generators(batch, example, key, 0)
    found = cp.jacobian_sq_norms(problem, probe, example, key, 16, gens)
    for b in range(2):
        n = int(batch.lengths[b])
        ids = batch.input_ids[b : b + 1, :n]
        words = hf.get_input_embeddings()(ids).detach()
        jac = torch.autograd.functional.jacobian(lambda e: hf(inputs_embeds=e).logits[0], words)  # [C, 1, n, D]
        np.testing.assert_allclose(found[b, :n].numpy(), jac.pow(2).sum(dim=(0, 1, 3)).numpy(), rtol=1e-4, atol=1e-8)


def test_linearized_solver_runs_on_layers_and_is_batch_invariant(sharp):
    fast = {"solver": "linearized", "probes": 8}
    together = sharp.explain(TEXTS, method="coperturbation", seed=0, **fast)
    alone = sharp.explain(TEXTS[1], method="coperturbation", seed=0, **fast)
    np.testing.assert_allclose(together[1].scores, alone.scores, rtol=1e-4)
    assert alone.cost.backward_passes == sharp.adapter.config.num_labels  # the logits' unit vectors
    layered = sharp.explain(TEXTS, method="coperturbation", seed=0, layerwise=True, **fast)
    single = sharp.explain(TEXTS[0], method="coperturbation", seed=0, layer=2, **fast)
    np.testing.assert_allclose(layered[0].scores[1], single.scores, rtol=1e-4)
    assert np.isfinite(layered[0].scores).all()
    # probes cut into blocks of PROBE_BLOCK rows, one block per chunk: the same estimate
    many = sharp.explain(TEXTS[0], method="coperturbation", seed=0, layer=2, solver="linearized", probes=20)
    small = sharp.explain(TEXTS[0], method="coperturbation", seed=0, layer=2, solver="linearized", probes=20, internal_batch_size=1)
    np.testing.assert_allclose(many.scores, small.scores, rtol=1e-4)
    assert many.cost.backward_passes == small.cost.backward_passes == 20
    for bad in ({"solver": "newton"}, {"objective": "raw"}, {"probes": 0}):
        with pytest.raises(heedful.InputError):
            sharp.explain(TEXTS[0], method="coperturbation", **bad)
