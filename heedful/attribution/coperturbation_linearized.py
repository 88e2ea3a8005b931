"""Co-perturbation's closed-form solver (``solver="linearized"``, ours): the objective's
small-noise expansion separates per token, so the optimal noise follows from each token's
squared Jacobian norm, estimated with Hutchinson probes in one batched backward."""

from __future__ import annotations

import math

import torch

from heedful.attribution.coperturbation_settings import (
    ACTIVATION_BUDGET,
    GRAD_CHUNK_OVERHEAD,
    InterestFit,
    Settings,
)
from heedful.attribution.noise import NoiseProbe
from heedful.engine.memory import Need
from heedful.engine.problem import Problem
from heedful.engine.runner import Runner

PROBE_BLOCK = 8
"""Probe rows of one problem run together at most: a sentence's probes are cut into blocks of
this many rows, so that one block of a long sentence fits the activation budget."""
VARIANCE_FLOOR = 1e-12
"""Smallest variance the linearized solver returns, as a share of the ceiling's (``lambda = 0``
would otherwise give zero noise and an infinite ``ln sigma``)."""


def fit_linearized(
    problem: Problem,
    probe: NoiseProbe,
    example: torch.Tensor,
    key: torch.Tensor,
    lam: torch.Tensor,
    scale: torch.Tensor,
    gens: list[torch.Generator],
    settings: Settings,
) -> InterestFit:
    """Closed-form optimum of the objective's small-noise expansion (ours; ``solver="linearized"``).

    For small noise ``phi(x + eps) - phi(x) ~ sum_j J_j eps_j`` (``J_j`` ``[M, D]``: the Jacobian
    of ``phi`` w.r.t. token ``j``'s representation), and with independent ``eps_j ~ N(0, sigma_j
    I)`` (``sigma_j`` the variance) the cross terms vanish in expectation::

        E||phi(x) - phi(x~)||^2  ~  sum_j sigma_j a_j,   a_j = ||J_j||_F^2

    so the objective separates into convex one-dimensional problems in ``sigma_j``:

    - ``"paper"``: ``sum_j sigma_j a_j - lambda (D/2) sum_j ln sigma_j`` -> ``sigma_j = lambda D / (2 a_j)``;
    - ``"normalised"``: ``sum_j sigma_j a_j / (M E) - (lambda / (4 N)) sum_j ln sigma_j`` (``M``
      probed elements, ``E`` their mean squared reference value, ``N`` real tokens; ``ln std =
      ln sigma / 2``) -> ``sigma_j = lambda M E / (4 N a_j)``;

    clipped to the ceiling ``scale^2`` (the constrained optimum of a convex problem in one
    variable; a token with ``a_j = 0`` gets the ceiling) and floored at
    :data:`VARIANCE_FLOOR` ``x scale^2``. ``a_j`` comes from :func:`jacobian_sq_norms`.
    Returns an :class:`InterestFit` whose ``sigma`` is the std ``sqrt(sigma_j)``, ``distortion``
    and ``objective`` the expansion's values, ``steps`` 0 and ``history`` empty.
    """
    batch = problem.batch
    n_problems = example.shape[0]
    real = batch.attention_mask.bool()[example]
    a = jacobian_sq_norms(problem, probe, example, key, settings.probes, gens, settings.internal_batch_size)
    tokens = real.sum(dim=1).clamp_min(1)
    if settings.objective == "paper":
        norm = torch.ones(n_problems)
        numer = lam * probe.dim / 2
    else:
        norm = torch.zeros(n_problems)
        for k in sorted(set(key.tolist())):  # at most L + 1 distinct keys
            rows = (key == k).nonzero().flatten()
            norm[rows] = probe.elements(example[rows], k).float() * probe.energy[k][example[rows]].clamp_min(1e-12)
        numer = lam * norm / (4 * tokens)
    ceiling = scale.pow(2)[:, None]
    var = torch.where(a > 0, numer[:, None] / a.clamp_min(1e-30), ceiling)
    var = torch.minimum(var, ceiling).clamp_min(VARIANCE_FLOOR * ceiling)
    dist = (var * a * real).sum(dim=1) / norm
    log_var = torch.log(var) * real
    entropy = 0.5 * probe.dim * log_var.sum(dim=1) if settings.objective == "paper" else log_var.sum(dim=1) / (4 * tokens)
    return InterestFit(
        sigma=var.sqrt() * real,
        objective=dist - lam * entropy,
        distortion=dist,
        steps=torch.zeros(n_problems, dtype=torch.long),
        converged=torch.ones(n_problems, dtype=torch.bool),
        history=torch.zeros(0, n_problems),
        scale=scale,
    )


def jacobian_sq_norms(
    problem: Problem,
    probe: NoiseProbe,
    example: torch.Tensor,
    key: torch.Tensor,
    probes: int,
    gens: list[torch.Generator],
    rows: int | None = None,
) -> torch.Tensor:
    """``a_j = ||J_j||_F^2`` ``[P, N]`` for every token of problem ``p``'s example at its key:
    the squared Frobenius norm of the Jacobian of ``phi`` w.r.t. token ``j``'s noised
    representation, at zero noise (0 on padding).

    Hutchinson's estimator: for ``v`` with ``E[v v^T] = I`` (Rademacher, drawn from the
    problem's generator ``gens[p]``), ``E||v^T J_j||^2 = ||J_j||_F^2``; one vector-Jacobian
    product ``v^T J`` gives the row for every token at once. ``probes`` such ``v`` per problem
    run as rows of batched forwards and backwards: blocks of up to :data:`PROBE_BLOCK` rows of
    a problem, chunked over problems by the runner (``rows`` fixes blocks per chunk). When ``phi`` has ``M <= probes`` elements (the head's logits)
    the ``M`` unit vectors are used instead: the sum is then exact.
    """
    adapter, batch = problem.adapter, problem.batch
    lengths = batch.lengths[example]
    out = torch.zeros(example.shape[0], batch.seq_len)
    runner = Runner.for_problem(problem, rows=rows, overhead=GRAD_CHUNK_OVERHEAD, max_memory=ACTIVATION_BUDGET)
    need = Need(grad="saved", hidden_states=True, eager=True)
    for k in sorted(set(key.tolist())):  # at most L + 1 distinct keys
        group = (key == k).nonzero().flatten()
        elements = probe.elements(example[group], k)
        exact = int(elements.max()) <= probes
        r = int(elements.max()) if exact else int(probes)
        vectors = [_probe_vectors(gens[int(p)], int(m), r, exact) for p, m in zip(group, elements, strict=True)]
        block = min(r, PROBE_BLOCK)
        blocks = math.ceil(r / block)
        units = torch.arange(group.shape[0]).repeat_interleave(blocks)  # (problem, block of probes)
        part = torch.arange(blocks).repeat(group.shape[0])
        for idx, width in runner.plan(lengths[group][units], row_cells=block, need=need):
            members, parts = units[idx], part[idx]
            probs = group[members]
            noise = torch.zeros(idx.shape[0] * block, width, probe.dim, requires_grad=True)
            with torch.enable_grad():
                diff, _ = probe.change(example[probs].repeat_interleave(block), k, noise)
                v = torch.zeros(idx.shape[0], block, diff.shape[1])
                for i, (u, b) in enumerate(zip(members.tolist(), parts.tolist(), strict=True)):
                    rows_here = vectors[u][b * block : (b + 1) * block]
                    v[i, : rows_here.shape[0], : rows_here.shape[1]] = rows_here
                (g,) = torch.autograd.grad((diff * v.view(-1, diff.shape[1])).sum(), noise)
            adapter.counter.backward += sum(min(block, r - b * block) for b in parts.tolist())
            sq = g.pow(2).sum(dim=-1).view(idx.shape[0], block, width).sum(dim=1)
            out[:, :width].index_add_(0, probs, sq)
        if not exact:
            out[group] = out[group] / r
    return out * batch.attention_mask.bool()[example]


def _probe_vectors(gen: torch.Generator, elements: int, r: int, exact: bool) -> torch.Tensor:
    """``r`` probe vectors ``[r, elements]`` of one problem over its real output elements: the unit
    vectors ``e_0 .. e_{r-1}`` (``exact``, ``r >= elements``) or Rademacher signs drawn from the
    problem's own generator (so that they do not depend on the batch)."""
    if exact:
        return torch.eye(r, elements)
    return torch.randint(0, 2, (r, elements), generator=gen).float() * 2 - 1
