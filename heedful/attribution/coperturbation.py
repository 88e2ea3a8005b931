"""Co-perturbation adaptive interest estimation, and Guan et al. 2019's reference settings.

Seed paper: "Do Pre-Trained Language Models Truly Focus on the Content They Are Expected to?"
(co-perturbation strategy, Eq. 2-3; adaptive estimation, Eq. 4 / Eq. 9 and Algorithm 1),
generalising Guan et al. 2019, "Towards a Deep and Unified Understanding of Deep Neural Models
in NLP" (ICML; reference code microsoft/nlp-recipes ``utils_nlp/interpreter/Interpreter.py``).

Every token ``j`` of a sentence gets its own Gaussian noise, all at once (co-perturbation):
``x~_j = x_j + eps_j``, ``eps_j ~ N(0, sigma_j I_D)``. The paper's objective (Eq. 4 / Eq. 9, with
``Sigma_j = sigma_j I`` and ``rho_j = 1 / sigma_j`` from Appendix A.2, so ``sigma_j`` is a
*variance*)::

    J = E_z[ ||phi(x) - phi(x~)||^2 ]  -  lambda * (D/2) * sum_j ln sigma_j

The first term (maximum likelihood) keeps the output unchanged, the second (maximum entropy)
pushes every token's noise up; the tokens the model cannot afford to have noised keep a small
``sigma``. Interest is ``rho_j = 1 / sigma_j`` (paper Eq. 8).

Objectives (``objective``):

- ``"paper"``: Eq. 9 as written. ``sigma_j = scale^2 sigmoid(theta_j)`` is the variance, the
  noise ``sqrt(sigma_j) z_j``, the distortion the raw sum of squares over ``phi``'s ``M``
  elements, and interest ``1 / sigma_j``. ``lambda`` then trades an ``M``-element sum against
  ``N * D / 2`` log-variances, so its meaning changes with the output size, the sentence length
  and the scale of ``phi``.
- ``"normalised"`` (default; ours, after Guan et al.): ``std_j = scale sigmoid(theta_j)`` and
  ``J = dist / (M E[phi^2]) - (lambda / 2) mean_j ln std_j`` -- the distortion is the mean
  squared change over the probed elements divided by the mean squared reference value (Guan et
  al.'s ``regularization=None``), the entropy term Eq. 9's divided by ``N * D``, with ``ln std``
  in place of ``ln sigma`` (half of it); interest ``1 / std_j``. It has the same minimiser as
  the paper's objective with ``lambda_paper = lambda * M * E[phi^2] / (2 N D)`` (multiply ``J`` by
  ``M E[phi^2]`` and use ``ln std = ln sigma / 2``): a per-sentence conversion, so one
  normalised ``lambda`` is a different paper ``lambda`` for every sentence. Guan et al.'s loss
  ``mean(D^2)/mean(s^2) - rate * mean_j log sigmoid(theta_j)`` is the normalised objective with
  ``lambda = 2 * rate`` (``log std`` and ``log sigmoid`` differ by the constant ``log scale``).

Solvers (``solver``):

- ``"adam"`` (default): Algorithm 1 -- Adam on ``theta`` with reparameterised samples.
- ``"linearized"`` (ours): for small noise ``E||phi(x) - phi(x~)||^2 ~ sum_j sigma_j
  ||J_j||_F^2`` (``J_j`` the Jacobian of ``phi`` w.r.t. token ``j``'s representation; the
  tokens' noises are independent and zero-mean, so cross terms vanish), which makes the
  objective separable and convex in each ``sigma_j``; its minimiser is closed-form,
  ``sigma_j = lambda D / (2 ||J_j||_F^2)`` (paper) or ``lambda M E[phi^2] / (4 N ||J_j||_F^2)``
  (normalised), clipped to the ceiling ``scale^2``. ``||J_j||_F^2`` comes from Hutchinson's
  estimator: ``probes`` Rademacher vector-Jacobian products, one batched backward for every
  token at once, or the ``M`` unit vectors (exact) when ``M <= probes`` (the head's logits).
  One forward and one backward over ``min(probes, M)`` rows per sentence instead of ``steps x
  samples``; first order only, so it misses what large noise does (saturation, interactions).

Defaults and where they come from:

=====================  ===============================  ==========================================
option                 default                          source
=====================  ===============================  ==========================================
``lam``                0.6                              the number of the paper's Figure 4 /
                                                        Section 5.2.1, in the normalised units: a
                                                        different paper lambda per sentence (the
                                                        report converts it; ``objective="paper"``
                                                        takes Eq. 9's units)
``lr``                 0.05 (Adam)                      ours (Guan et al.: 0.01; the paper names
                                                        no optimiser)
``space``              embedding module output          Guan et al. (``hidden_states[0]``)
``init`` (``theta``)   0 for every token (``"zeros"``)  ours (Guan et al.: N(0, 1), ``"randn"``;
                                                        ``"linearized"``: the first-order optimum)
``scale``              3 x std of the noised input      ours (Guan et al.: 10 x std of the word-
                                                        embedding matrix; see ``noise_scale``)
``samples``            8 per step, one batched forward  ours (paper silent; Guan et al. use 1)
``max_steps``          100                              ours (Guan et al.: 5000 fixed iterations)
``window`` / ``tol``   25 steps / 0.5 %                 ours (paper: "until converge")
best state kept        yes (``keep="best"``)            Algorithm 1 / Guan et al. (``"average"``:
                                                        mean theta of the last ``window`` steps)
``antithetic``         no                               ours (pairs ``z, -z`` of noise draws)
``crn``                no                               ours (the same draws at every step)
``schedule``           ``"constant"``                   ours (``"cosine"``: annealed to 0)
``output``             all head logits at the anchor    ours (paper: "the prediction" phi(s))
``objective``          ``"normalised"``                 ours, after Guan et al. (see above)
``solver``             ``"adam"``                       paper (Algorithm 1); ``"linearized"`` ours
``probes``             16 (linearized solver)           ours (exact for outputs of <= 16 elements)
``score``              rho = 1/sigma, normalised        paper (Eq. 8); normalisation ours
=====================  ===============================  ==========================================

Warm start (``init="linearized"``): the linearized solver's ``||J_j||_F^2`` (one extra
backward pass over the output's unit vectors or probes) gives the first-order optimum's shape;
its level (a small-noise extrapolation) is dropped and the bounded noise is set to the cold
start's geometric mean, ``theta`` clipped to ``+-4`` (:func:`linearized_theta`); then Adam runs as
usual, with the same noise draws as the cold start. Seed agreement, cost and faithfulness of
these options, and whether the warm start saves time, are measured on a dev split of the train
sentences by ``heedful reproduce coperturbation --option only=stability``
(``docs/results/coperturbation-stability.md``).

``init``, ``lr``, ``samples`` and ``max_steps`` were first picked on 8 movie test sentences; the
evidence that keeps them is now on a dev split of the train sentences
(``heedful reproduce coperturbation --option only=stability``, the "Seed agreement" table of
``docs/results/coperturbation-stability.md``, with each setting's sentences and intervals): a larger
step (``lr`` 0.1) or fewer samples (4) make the seeds agree less, and 4 samples also end at a
higher objective; a smaller step with more steps (``lr`` 0.02, 250 steps) or more samples (16)
make them agree more at about twice the cost; more steps at the same ``lr`` agree no better
unless the last iterates are averaged -- consistent with the seeds' disagreement being the
step's noise around a flat optimum. None of them reaches a mean seed Spearman of 0.9, so the defaults
stay the cheaper point of that trade.

From a random start Adam (steps of about ``lr``) cannot carry ``theta`` far enough from its
N(0, 1) draw in 500 steps at lr 0.01: the final ranking still correlated 0.30-0.42 with the
starting draw, and two seeds agreed at 0.40. Starting every token at the same ``theta`` leaves
the ranking to the gradients alone. The convergence test compares mean ``J`` over consecutive
windows; ``J`` is a sampled estimate, so on real models it mostly stops problems that are flat
early and otherwise runs ``max_steps``.

Batching: many sentences -- and, for layer-wise interest, every layer of every sentence, and
for lambda sweeps every lambda -- are independent optimisation *problems* solved together: each
step runs ``problems x samples`` noised copies in batched forwards and backwards (chunks of
similar length, as many as fit :data:`ACTIVATION_BUDGET` by the memory estimator,
:mod:`heedful.engine.memory`). Problems that have converged leave the
batch. Each problem draws its noise (and, with ``init="randn"``, its initial ``theta``) from its own generator, seeded
from ``seed``, the example's text and the probed layer, so the scores of a sentence do not
depend on the batch it is in.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Annotated

import torch

from heedful.attribution.coperturbation_linearized import fit_linearized, jacobian_sq_norms
from heedful.attribution.coperturbation_settings import (
    ACTIVATION_BUDGET,
    ADAM_BETAS,
    ADAM_EPS,
    GRAD_CHUNK_OVERHEAD,
    GUAN2019,
    INIT_CLIP,
    SCORES,
    Init,
    InterestFit,
    Keep,
    Objective,
    Schedule,
    Score,
    Settings,
    Solver,
)
from heedful.attribution.noise import (
    NoiseProbe,
    PhiOutput,
    ScaleBasis,
    Space,
    check_choice,
    noise_scale,
    resolve_layer,
)
from heedful.engine.batch import Batch
from heedful.engine.memory import Need
from heedful.engine.options import AT_LEAST_ONE, KEYED_WHEN_SET, NON_NEGATIVE, POSITIVE, RUNTIME
from heedful.engine.problem import Problem
from heedful.engine.runner import Runner
from heedful.engine.seeding import example_generators
from heedful.errors import InputError
from heedful.progress import task
from heedful.registry import register

COPERTURBATION_COST = (
    "adam: steps x (samples forwards + 1 backward), batched over sentences (converged ones drop out); "
    "linearized: 1 forward + 1 backward over min(probes, outputs) rows"
)
GUAN2019_COST = "5000 x (1 forward + 1 backward), batched over sentences"


def _passes(options: dict) -> tuple[float, float]:
    """Sequences per sentence at most (:data:`COPERTURBATION_COST`; adam stops early when it
    converges): ``(1 + steps x samples, steps x samples)`` (each step's backward runs through
    its samples' rows), linearized ``(2, 1)``."""
    if options.get("solver", "adam") == "linearized":
        return 2, 1
    rows = options["max_steps"] * options["samples"]
    return 1 + rows, rows


def problem_generators(batch: Batch, example: torch.Tensor, key: torch.Tensor, seed: int | None) -> list[torch.Generator]:
    """One generator per problem, from ``seed``, its example's text and its layer key (not its
    lambda: a lambda sweep shares the noise draws, which smooths the curve)."""
    bases = [g.initial_seed() for g in example_generators(batch, seed)]
    gens = []
    for e, k in zip(example.tolist(), key.tolist(), strict=True):
        g = torch.Generator()
        g.manual_seed((bases[e] + 1_000_033 * (k + 2)) % (2**63 - 1))
        gens.append(g)
    return gens


def fit_interest(
    problem: Problem,
    example: torch.Tensor,
    key: torch.Tensor,
    lam: torch.Tensor,
    settings: Settings = Settings(),
    seed: int | None = 0,
    probe: NoiseProbe | None = None,
) -> InterestFit:
    """Algorithm 1 for ``P`` problems at once: problem ``p`` estimates the noise tolerance of
    example ``example[p]`` with the distortion measured at layer key ``key[p]`` (``HEAD`` or
    1..L) and weight ``lam[p]``.

    Each step: draw ``samples`` noise tensors per active problem, run all noised copies in
    batched forwards, compute ``J`` per problem (Eq. 4/9), back-propagate to ``theta`` and take
    an Adam step (written out as tensor ops so that problems can stop independently). A problem
    stops when the mean of ``J`` over the last ``window`` steps differs from the mean over the
    window before by less than ``tol`` relative, or after ``max_steps``. ``probe`` replaces the
    model's :class:`NoiseProbe` (anything with ``dim`` and ``distortion``; used in tests). The
    problem's reference pass is the clean pass (its hidden states are asked for once).
    """
    settings.check()
    adapter, batch = problem.adapter, problem.batch
    example, key = example.long(), key.long()
    lam = lam.float()
    n_problems = example.shape[0]
    if probe is None:
        keys = tuple(sorted(set(key.tolist())))
        probe = NoiseProbe.build(problem, keys, settings.space, settings.output)
    scale = noise_scale(adapter, probe, example, settings.scale_factor, settings.scale_basis, settings.scale)
    gens = problem_generators(batch, example, key, seed)
    if settings.solver == "linearized":
        return fit_linearized(problem, probe, example, key, lam, scale, gens, settings)
    lengths = batch.lengths[example]
    seq, dim, samples = batch.seq_len, probe.dim, int(settings.samples)
    real = batch.attention_mask.bool()[example]  # [P, N]

    began, began_cpu = time.perf_counter(), time.process_time()
    theta = torch.zeros(n_problems, seq, device=adapter.device)
    if settings.init == "randn":
        for p, (g, n) in enumerate(zip(gens, lengths.tolist(), strict=True)):
            theta[p, :n] = torch.randn(n, generator=g, device="cpu")
    elif settings.init == "linearized":
        # the probes draw from generators of their own, so the noise draws match the cold start's
        probe_gens = [torch.Generator().manual_seed((g.initial_seed() + 7_368_787) % (2**63 - 1)) for g in gens]
        a = jacobian_sq_norms(problem, probe, example, key, settings.probes, probe_gens, settings.internal_batch_size)
        theta = linearized_theta(a, real, settings.objective)
    init_seconds = time.perf_counter() - began
    init_cpu = time.process_time() - began_cpu
    adam_m, adam_v = torch.zeros_like(theta), torch.zeros_like(theta)
    best_theta = theta.clone()
    best_j = torch.full((n_problems,), float("inf"), device=adapter.device)
    best_dist = torch.zeros(n_problems, device=adapter.device)
    last_dist = torch.zeros(n_problems, device=adapter.device)
    steps = torch.zeros(n_problems, dtype=torch.long, device="cpu")
    converged = torch.zeros(n_problems, dtype=torch.bool, device="cpu")
    active = torch.ones(n_problems, dtype=torch.bool, device="cpu")
    history = torch.full((settings.max_steps, n_problems), float("nan"), device=adapter.device)
    elapsed = torch.zeros(settings.max_steps, 2, dtype=torch.float64, device="cpu")  # timings
    recent = torch.zeros(settings.window, n_problems, seq, device=adapter.device)  # ring of the last iterates (keep="average")
    common = [None] * n_problems if settings.crn else None  # each problem's draws, reused every step
    runner = Runner.for_problem(
        problem, rows=settings.internal_batch_size or None, overhead=GRAD_CHUNK_OVERHEAD, max_memory=ACTIVATION_BUDGET
    )
    # noised passes keep their graph, run inside an interception (eager attention) and read hidden states
    need = Need(grad="saved", hidden_states=True, eager=True)

    # at most max_steps; the bar ends early when every problem has converged
    with task(f"co-perturbation solver steps ({n_problems} texts)", total=settings.max_steps) as solver:
        for t in range(1, settings.max_steps + 1):
            act = active.nonzero().flatten()
            grad = torch.zeros(act.shape[0], seq, device=adapter.device)
            j_now = torch.zeros(act.shape[0], device=adapter.device)
            dist_now = torch.zeros(act.shape[0], device=adapter.device)
            for idx, width in runner.plan(lengths[act], row_cells=samples, need=need):
                probs = act[idx]
                z = _step_noise(gens, probs, lengths, samples, width, dim, settings.antithetic, common)
                th = theta[probs, :width].clone().requires_grad_(True)
                with torch.enable_grad():
                    j, dist = _objective(
                        probe, example[probs], key[probs], lam[probs], th, z, real[probs, :width], scale[probs],
                        settings.objective,
                    )
                    (g_th,) = torch.autograd.grad(j.sum(), th)
                adapter.counter.backward += probs.shape[0] * samples
                grad[idx, :width], j_now[idx], dist_now[idx] = g_th, j.detach(), dist.detach()
            history[t - 1, act] = j_now
            last_dist[act] = dist_now
            better = j_now < best_j[act]  # the state that produced J (before the step) is kept
            keep = act[better]
            best_j[keep], best_dist[keep], best_theta[keep] = j_now[better], dist_now[better], theta[keep]
            recent[(t - 1) % settings.window, act] = theta[act]
            lr = learning_rate(settings.lr, t, settings.max_steps, settings.schedule)
            theta[act], adam_m[act], adam_v[act] = _adam(theta[act], grad, adam_m[act], adam_v[act], t, lr)
            steps[act] = t
            elapsed[t - 1, 0], elapsed[t - 1, 1] = time.perf_counter() - began, time.process_time() - began_cpu
            if settings.tol > 0 and t % settings.window == 0 and t >= 2 * settings.window:
                done = _flat(history[t - 2 * settings.window : t, act], settings.window, settings.tol)
                converged[act[done]] = True
                active[act[done]] = False
            solver.advance()
            if not active.any():
                break
    mean_theta, mean_j = _averaged(recent, history, steps, settings.window)
    states = {"best": best_theta, "last": theta, "average": mean_theta}
    if settings.keep == "last":
        best_j, best_dist = history[steps - 1, torch.arange(n_problems, device="cpu")], last_dist
    elif settings.keep == "average":
        best_j, best_dist = mean_j, last_dist  # the averaged state's distortion is not measured; the last stands in
    sigmas = {rule: torch.exp(_log_std(th, scale, settings.objective)) * real for rule, th in states.items()}
    t_run = int(steps.max())
    return InterestFit(
        sigmas[settings.keep], best_j, best_dist, steps, converged, history[:t_run], scale, elapsed[:t_run, 0],
        init_seconds, sigmas, elapsed[:t_run, 1], init_cpu,
    )


def _averaged(
    recent: torch.Tensor, history: torch.Tensor, steps: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``keep="average"``: per problem, the mean ``theta`` ``[P, N]`` of its last ``min(window,
    steps)`` iterates (the states that produced those steps' ``J``; ``recent`` ``[window, P, N]``
    is a ring indexed by ``(t - 1) % window``) and the mean ``J`` ``[P]`` over those steps."""
    n_problems = steps.shape[0]
    theta = torch.zeros(recent.shape[1:], device=recent.device)
    j = torch.zeros(n_problems, device=history.device)
    for p, t in enumerate(steps.tolist()):
        k = min(window, t)
        slots = [(s - 1) % window for s in range(t - k + 1, t + 1)]
        theta[p] = recent[slots, p].mean(dim=0)
        j[p] = history[t - k : t, p].mean()
    return theta, j


def learning_rate(lr: float, t: int, max_steps: int, schedule: str) -> float:
    """Adam's step size at step ``t`` (1-based): ``lr`` (``"constant"``) or cosine annealing
    (Loshchilov & Hutter 2017, no restarts) from ``lr`` at step 1 to 0 after ``max_steps``:
    ``lr (1 + cos(pi (t - 1) / max_steps)) / 2``."""
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * (t - 1) / max_steps))
    return lr


def linearized_theta(a: torch.Tensor, real: torch.Tensor, objective: str) -> torch.Tensor:
    """Warm start ``theta`` ``[P, N]`` from the squared Jacobian norms ``a`` ``[P, N]``
    (:func:`jacobian_sq_norms`) for ``init="linearized"``.

    The first-order optimum (:func:`fit_linearized`) is ``sigma_j = c / a_j`` (a variance); its
    overall level ``c`` is a small-noise extrapolation, so only its shape is kept: the bounded
    quantity ``b_j`` (the std over the ceiling for the normalised objective, the variance over
    the ceiling's square for ``"paper"``; see :func:`_log_std`) is ``a_j^(-1/2)`` resp.
    ``a_j^(-1)`` scaled so that its geometric mean over the real tokens is the cold start's
    ``sigmoid(0) = 1/2`` (tokens with ``a_j = 0`` left out of the mean); ``theta_j = logit(b_j)`` clipped to ``+-``:data:`INIT_CLIP` (a token
    with ``a_j = 0`` gets the upper clip). Padding gets 0.
    """
    power = 1.0 if objective == "paper" else 0.5
    log_b = -power * torch.log(a.clamp_min(1e-30))
    counted = real & (a > 0)  # a token with no gradient has no finite first-order optimum
    count = counted.sum(dim=1, keepdim=True).clamp_min(1)
    centre = (log_b * counted).sum(dim=1, keepdim=True) / count
    log_b = log_b - centre + math.log(0.5)
    lo, hi = math.log(torch.sigmoid(torch.tensor(-INIT_CLIP)).item()), math.log(torch.sigmoid(torch.tensor(INIT_CLIP)).item())
    log_b = log_b.clamp(lo, hi)
    theta = log_b - torch.log1p(-torch.exp(log_b))  # logit(b)
    theta = torch.where(a > 0, theta, torch.full_like(theta, INIT_CLIP))
    return (theta.clamp(-INIT_CLIP, INIT_CLIP) * real).float()


def _step_noise(
    gens: list[torch.Generator],
    probs: torch.Tensor,
    lengths: torch.Tensor,
    samples: int,
    width: int,
    dim: int,
    antithetic: bool,
    common: list | None,
) -> torch.Tensor:
    """This step's standard normal draws ``[P, S, W, D]`` for problems ``probs``: fresh ones from
    each problem's generator, in antithetic pairs ``z, -z`` (``ceil(S / 2)`` drawn, the first
    ``S`` kept) when ``antithetic``; with ``common`` (common random numbers) the problem's first
    draws are kept there and reused at every step."""
    drawn = math.ceil(samples / 2) if antithetic else samples
    out = torch.zeros(probs.shape[0], samples, width, dim, device="cpu")  # drawn from CPU generators
    for i, p in enumerate(probs.tolist()):
        n = int(lengths[p])
        z = common[p] if common is not None else None
        if z is None:
            z = torch.randn((drawn, n, dim), generator=gens[p], device="cpu")
            if antithetic:
                z = torch.cat([z, -z])[:samples]
            if common is not None:
                common[p] = z
        out[i, :, :n] = z
    return out


def _objective(
    probe: NoiseProbe,
    example: torch.Tensor,
    key: torch.Tensor,
    lam: torch.Tensor,
    theta: torch.Tensor,
    z: torch.Tensor,
    real: torch.Tensor,
    scale: torch.Tensor,
    objective: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``J`` and its distortion term per problem ``[P]`` (Eq. 4/9, reparameterised:
    ``eps_j = std_j z_j``; ``theta`` ``[P, W]``, ``z`` ``[P, S, W, D]``).

    ``"paper"``: ``||phi(x) - phi(x~)||^2 - lambda (D/2) sum_j ln sigma_j`` with ``sigma_j =
    std_j^2`` the variance (Eq. 9 with ``Sigma_j = sigma_j I``, Appendix A.2). ``"normalised"``:
    the distortion over the mean squared reference (per element) and the entropy term over
    ``N * D``: ``dist / (M E[phi^2]) - lambda (D/2) sum_j ln std_j / (N D)``.
    """
    n_p, samples, seq, dim = z.shape
    log_std = _log_std(theta, scale, objective) * real
    std = torch.exp(log_std) * real
    noise = (std[:, None, :, None] * z).reshape(n_p * samples, seq, dim)
    rows_example = example.repeat_interleave(samples)
    rows_key = key.repeat_interleave(samples)
    paper = objective == "paper"
    dist = probe.distortion(rows_example, rows_key, noise, not paper).view(n_p, samples).mean(dim=1)
    if paper:  # (D/2) sum_j ln sigma_j, ln sigma_j = 2 ln std_j
        entropy = dim * log_std.sum(dim=1)
    else:  # (D/2) sum_j ln std_j / (N * D)
        entropy = 0.5 * log_std.sum(dim=1) / real.sum(dim=1).clamp_min(1)
    return dist - lam * entropy, dist


def _log_std(theta: torch.Tensor, scale: torch.Tensor, objective: str) -> torch.Tensor:
    """``ln`` of the noise std ``[P, W]`` from ``theta`` ``[P, W]`` and the ceilings ``scale``
    ``[P]`` (a std): ``std = scale sigmoid(theta)`` for the normalised objective (Guan et al.);
    for ``"paper"`` the variance is the bounded parameter, ``sigma = scale^2 sigmoid(theta)``,
    ``std = sqrt(sigma)``. The optimum is the same either way; the path of the optimiser is not."""
    ls = torch.nn.functional.logsigmoid(theta)
    return torch.log(scale)[:, None] + (0.5 * ls if objective == "paper" else ls)


def _adam(
    theta: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, lr: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of Adam (Kingma & Ba 2015; ``torch.optim.Adam``'s defaults) as tensor ops."""
    b1, b2 = ADAM_BETAS
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return theta - lr * m_hat / (v_hat.sqrt() + ADAM_EPS), m, v


def _flat(history: torch.Tensor, window: int, tol: float) -> torch.Tensor:
    """``[P]`` bool: the mean of the last window moved less than ``tol`` relative to the one before."""
    prev, cur = history[:window].mean(dim=0), history[window:].mean(dim=0)
    denom = torch.maximum(prev.abs(), cur.abs()).clamp_min(1e-8)
    return (cur - prev).abs() / denom < tol


# ---------------------------------------------------------------------------------- scores
def noise_level(sigma: torch.Tensor, objective: str) -> torch.Tensor:
    """What interest inverts (paper Eq. 8, ``rho = 1 / sigma``) from noise stds ``sigma``
    ``[..., N]``: the variance ``sigma^2`` for ``objective="paper"`` (its ``Sigma_j = sigma_j
    I``), the std for the normalised objective (Guan et al.'s ``sigma``)."""
    return sigma.pow(2) if objective == "paper" else sigma


def interest_scores(
    sigma: torch.Tensor, content: torch.Tensor, real: torch.Tensor, score: str = "rho", normalize: bool = True
) -> torch.Tensor:
    """Interest from noise stds ``sigma`` ``[..., N]``: ``rho = 1 / sigma`` (paper Eq. 8).

    ``normalize``: divide by the sum of ``rho`` over content tokens (special tokens keep a score
    but are left out of the sum). ``score="log_rho"``: the log of that (``-ln sigma`` when not
    normalised). Padding gets 0.
    """
    check_choice("score", score, SCORES)
    rho = torch.where(real, 1.0 / sigma.clamp_min(1e-30), torch.zeros_like(sigma))
    if normalize:
        rho = rho / (rho * content).sum(dim=-1, keepdim=True).clamp_min(1e-30)
    if score == "log_rho":
        return torch.where(real, torch.log(rho.clamp_min(1e-30)), torch.zeros_like(rho))
    return rho


def estimate_interest(
    problem: Problem,
    *,
    layers: list[int | None] | None = None,
    lams: list[float] | None = None,
    settings: Settings = Settings(),
    seed: int | None = 0,
) -> tuple[InterestFit, tuple[int, int, int]]:
    """Interest of every example at every layer in ``layers`` (``None`` = head output) and every
    lambda in ``lams``, optimised together. Problems are ordered example-major, then layer,
    then lambda: the result's ``sigma`` reshapes to ``[B, len(layers), len(lams), N]``.
    """
    keys = [resolve_layer(problem.adapter, k) for k in (layers or [None])]
    lam_values = list(lams) if lams is not None else [settings.lam]
    bsz = len(problem)
    ex = torch.arange(bsz, device=problem.batch.input_ids.device).repeat_interleave(len(keys) * len(lam_values))
    key = torch.tensor(keys, device=problem.batch.input_ids.device).repeat_interleave(len(lam_values)).repeat(bsz)
    lam = torch.tensor(lam_values, dtype=torch.float32, device=problem.batch.input_ids.device).repeat(bsz * len(keys))
    fit = fit_interest(problem, ex, key, lam, settings, seed)
    return fit, (bsz, len(keys), len(lam_values))


def _scores_for(
    problem: Problem,
    settings: Settings,
    layer: int | None,
    layerwise: bool,
    score: str,
    normalize: bool,
    seed: int | None,
) -> torch.Tensor:
    if layerwise and layer is not None:
        raise InputError("give either layer=k or layerwise=True, not both")
    batch = problem.batch
    layers: list[int | None] = list(range(1, problem.adapter.num_layers + 1)) if layerwise else [layer]
    fit, (bsz, n_layers, _) = estimate_interest(problem, layers=layers, settings=settings, seed=seed)
    sigma = noise_level(fit.sigma, settings.objective).view(bsz, n_layers, batch.seq_len)
    content = batch.content_mask[:, None, :]
    real = batch.attention_mask.bool()[:, None, :]
    scores = interest_scores(sigma, content, real, score, normalize)
    return scores if layerwise else scores[:, 0]


# Both estimators read hidden states off the reference pass, which then serves as the clean
# pass (no second one).
@register("coperturbation", family="perturbation", cost=COPERTURBATION_COST, passes=lambda o, n: _passes(o), needs_hidden=True, version=2, needs=("blocks",))
def coperturbation(
    problem: Problem,
    *,
    lam: Annotated[float, NON_NEGATIVE] = Settings.lam,
    samples: Annotated[int, AT_LEAST_ONE] = Settings.samples,
    max_steps: Annotated[int, AT_LEAST_ONE] = Settings.max_steps,
    window: Annotated[int, AT_LEAST_ONE] = Settings.window,
    tol: float = Settings.tol,
    lr: Annotated[float, POSITIVE] = Settings.lr,
    scale: Annotated[float | None, POSITIVE] = None,
    scale_factor: Annotated[float | None, POSITIVE] = None,
    scale_basis: ScaleBasis = "input",
    space: Space = "embedding_output",
    output: PhiOutput = "logits",
    layer: int | None = None,
    layerwise: bool = False,
    score: Score = "rho",
    normalize: bool = True,
    objective: Objective = "normalised",
    solver: Solver = "adam",
    probes: Annotated[int, AT_LEAST_ONE] = Settings.probes,
    keep: Keep = "best",
    init: Init = Settings.init,
    antithetic: Annotated[bool, KEYED_WHEN_SET] = Settings.antithetic,
    crn: Annotated[bool, KEYED_WHEN_SET] = Settings.crn,
    schedule: Annotated[Schedule, KEYED_WHEN_SET] = "constant",
    seed: int | None = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Learned per-token Gaussian noise on all tokens at once; interest = 1/sigma (tokens that tolerate little noise).

    Co-perturbation interest ``[B, N]`` (``[B, L, N]`` with ``layerwise=True``: layers 1..L).

    ``lam``: weight of the maximum-entropy term (paper Eq. 4). ``samples``: noise draws per step
    (one batched forward). ``layer=k``: distortion of all tokens' states at layer ``k`` instead of
    the head's ``output`` (``"logits"``, ``"probs"``, ``"log_probs"`` or ``"target"``, the
    explained scalar -- use it for contrastive targets). ``space``: noise on the embedding
    module's output (default) or the raw ``"word_embeddings"``. ``scale``: the noise ceiling;
    ``None`` (default) is ``scale_factor x`` the std of the noised representation
    (``scale_basis="input"``, factor 3 when ``None``) or of the word-embedding matrix
    (``"word_embeddings"``, factor 10). ``score``: normalised ``"rho"`` (default) or
    ``"log_rho"``; ``normalize=False`` for raw ``1/sigma``. ``objective="paper"``: Eq. 9 as
    written (raw distortion, ``sigma_j`` the variance, interest ``1 / sigma_j``; ``lam`` is then in
    the paper's units, see the module docstring for the conversion). ``solver="linearized"``:
    the closed-form optimum of the small-noise expansion, ``||J_j||_F^2`` from ``probes``
    Hutchinson probes (exact when the output has at most ``probes`` elements). ``keep``: report the
    lowest-objective state (``"best"``), the final one (``"last"``) or the mean ``theta`` of the
    last ``window`` iterates (``"average"``). ``init``: every ``theta`` starts at 0 (``"zeros"``),
    at a seeded N(0, 1) draw (``"randn"``, Guan et al.) or at the first-order optimum's shape
    (``"linearized"``: the linearized solver's noise, rescaled to the cold start's level, then
    optimised; one extra backward pass -- with ``keep="average"`` its seeds agree more, because
    they share that deterministic start, at some cost in faithfulness: measured in
    ``docs/results/coperturbation-stability.md``). ``antithetic``: noise draws in pairs ``z, -z``.
    ``crn``: the same draws at every step (common random numbers). ``schedule``: ``"constant"``
    learning rate or ``"cosine"`` annealing to 0 over ``max_steps``.

    Source: Do Pre-Trained Language Models Truly Focus on the Content They Are Expected to?
    (co-perturbation, Eq. 2-4/9, Algorithm 1), generalising Guan et al. 2019 (ICML)
    """
    settings = Settings(
        lam=lam, samples=samples, lr=lr, max_steps=max_steps, window=window, tol=tol, scale=scale,
        scale_factor=scale_factor, scale_basis=scale_basis, space=space, output=output, objective=objective,
        solver=solver, probes=probes, keep=keep, init=init, antithetic=antithetic, crn=crn, schedule=schedule,
        internal_batch_size=internal_batch_size,
    )
    return _scores_for(problem, settings, layer, layerwise, score, normalize, seed)


@register("guan2019", family="perturbation", cost=GUAN2019_COST, passes=lambda o, n: _passes(o), needs_hidden=True, needs=("blocks",))
def guan2019(
    problem: Problem,
    *,
    rate: Annotated[float, NON_NEGATIVE] = 0.1,
    samples: Annotated[int, AT_LEAST_ONE] = GUAN2019.samples,
    max_steps: Annotated[int, AT_LEAST_ONE] = GUAN2019.max_steps,
    lr: Annotated[float, POSITIVE] = GUAN2019.lr,
    layer: int | None = None,
    layerwise: bool = False,
    score: Score = "rho",
    normalize: bool = True,
    keep: Keep = "best",
    seed: int | None = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Guan et al.'s maximum-entropy noise learning with its reference settings (rate 0.1, 1 sample, 5000 steps).

    Guan et al. 2019 (Eq. 7): ``L = mean(D^2) / mean(phi^2) - rate * mean_j log sigma_j``.

    The same optimiser as :func:`coperturbation` with the reference code's settings: ``rate``
    0.1 (``lam = 2 * rate``), one noise draw per step, 5000 Adam steps at lr 0.01 with no early
    stop, ``scale`` = 10 x std(word embeddings) (the code's recommended value; its literal
    default 0.5 is that value for BERT-base), lowest-loss state kept. One deliberate
    difference: the reference saves the parameters *after* the step that produced the lowest
    loss; we keep the parameters that produced it. Shapes as :func:`coperturbation`. The other
    settings (noise space, output, convergence test, noise ceiling) are the reference's; for
    other values use :func:`coperturbation`, which takes them all.

    Source: Guan et al. 2019, Towards a Deep and Unified Understanding of Deep Neural Models in NLP
    (ICML, Eq. 7; microsoft/nlp-recipes Interpreter.py reference settings)
    """
    settings = replace(
        GUAN2019, lam=2.0 * rate, samples=samples, lr=lr, max_steps=max_steps, keep=keep,
        internal_batch_size=internal_batch_size,
    )
    return _scores_for(problem, settings, layer, layerwise, score, normalize, seed)
