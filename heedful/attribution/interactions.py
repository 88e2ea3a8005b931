"""Pairwise Shapley interactions between tokens: the Shapley interaction index of every pair and
the order-2 k-SII token scores (Bordt & von Luxburg 2023), estimated from one set of coalitions
by SHAP-IQ's unbiased sampling estimator (Fumagalli et al. 2023) -- exact when the budget holds
every coalition.

The game is the explained output with a coalition ``U`` of the ``M`` removable tokens kept and
the others removed, ``v(U)``. The Shapley interaction index (SII, Grabisch & Roubens 1999) of a
set ``S`` of ``s`` tokens is ``sum_{T in N \\ S} m_s(|T|) Delta_S v(T)`` with
``m_s(t) = t! (M - t - s)! / (M - s + 1)!`` and the discrete derivative
``Delta_S v(T) = sum_{L in S} (-1)^{s - |L|} v(T + L)``; for ``s = 1`` it is the Shapley value.
Written over coalitions, ``SII(S) = sum_U v(U) (-1)^{s - |U & S|} m_s(|U| - |U & S|)``: linear in
``v``, so every evaluated coalition adds to every token's and every pair's index at once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Annotated, Any

import torch

from heedful.attribution._masks import Features, features_of, score_samples, to_tokens
from heedful.attribution._precision import SampledPrecision
from heedful.attribution.perturbation import Output
from heedful.attribution.surrogate import AT_LEAST_TWO
from heedful.engine.options import AT_LEAST_ONE, NON_NEGATIVE, RUNTIME
from heedful.engine.perturb import Removal
from heedful.engine.precision import forward_precision
from heedful.engine.problem import Problem
from heedful.engine.seeding import example_generators
from heedful.registry import register


def _passes(options: Mapping[str, Any], tokens: int) -> tuple[float, float]:
    return (1 + min(options["n_samples"], 2 ** min(tokens, 62)), 0)


def plan_sizes(m: int, budget: int) -> tuple[list[int], list[int]]:
    """Coalition sizes enumerated whole and sizes sampled for ``m`` players and ``budget``
    evaluations: pairs of sizes ``(u, m - u)`` from the outside in (``0`` and ``m`` first) are
    enumerated while all their coalitions fit the budget (SHAP-IQ's border trick); the sizes left
    are sampled with the rest of the budget. ``budget >= 2^m`` enumerates every size."""
    whole: list[int] = []
    used = 0
    for u in range(m // 2 + 1):
        sizes = sorted({u, m - u})
        count = sum(math.comb(m, s) for s in sizes)
        if used + count > budget:
            break
        whole += sizes
        used += count
    return sorted(whole), [u for u in range(m + 1) if u not in whole]


def _log_weight(order: int, m: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``log m_s(t) = log(t! (m - t - s)! / (m - s + 1)!)`` for players ``m`` ``[B, 1]`` and
    sizes ``t`` ``[B, K]`` (``-inf`` outside ``0 <= t <= m - s``)."""
    ok = (t >= 0) & (t <= m - order)
    top = (m - order).clamp(min=0)
    safe = torch.minimum(t.clamp(min=0), top)
    found = torch.lgamma(safe + 1) + torch.lgamma(top - safe + 1) - torch.lgamma(top + 2)
    return torch.where(ok, found, torch.full_like(found, -math.inf))


def coalitions(m: int, budget: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One example's coalitions ``[K, m]`` (bool, the empty one first) and each one's weight in
    the estimator ``[K]``: 1 for the sizes enumerated whole, ``1 / (R p(U))`` for the ``R``
    sampled ones, drawn with replacement -- size ``u`` with probability ``q(u)`` proportional to
    KernelSHAP's ``1 / (u (m - u))`` over the sizes left (:func:`plan_sizes`), members uniform,
    so ``p(U) = q(u) / C(m, u)``."""
    cpu = torch.device("cpu")
    whole, left = plan_sizes(m, budget)
    rows = [[i in chosen for i in range(m)] for u in whole for chosen in itertools.combinations(range(m), u)]
    exact = torch.tensor(rows, dtype=torch.bool, device=cpu).reshape(-1, m)
    weight = torch.ones(len(exact), dtype=torch.float64, device=cpu)
    drawn = budget - len(exact)
    if not left or drawn <= 0:
        return exact, weight
    sizes = torch.tensor(left, dtype=torch.float64, device=cpu)
    q = 1.0 / (sizes * (m - sizes))
    q = q / q.sum()
    pick = torch.multinomial(q, drawn, replacement=True, generator=gen)
    size = sizes[pick].long()
    rank = torch.rand((drawn, m), generator=gen, device=cpu).argsort(dim=1).argsort(dim=1)
    sampled = rank < size[:, None]  # the `size` lowest-ranked are kept
    log_comb = torch.lgamma(torch.tensor(m + 1.0, dtype=torch.float64, device=cpu)) - torch.lgamma(size + 1.0) - torch.lgamma(m - size + 1.0)
    inverse = torch.exp(log_comb - torch.log(q[pick])) / drawn  # 1 / (R p(U))
    return torch.cat([exact, sampled]), torch.cat([weight, inverse])


def interaction_indices(keep: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapley values ``[B, M]`` and pairwise SII ``[B, M, M]`` (zero diagonal) from coalitions
    ``keep`` ``[B, K, M]`` (bool, 0 on padding features), their game values minus the empty
    coalition's ``y`` ``[B, K]`` and estimator weights ``[B, K]`` (0 on padding rows), for
    examples of ``counts`` ``[B]`` players: ``sum_k weight_k y_k (-1)^{s - |U_k & S|}
    m_s(|U_k| - |U_k & S|)`` for every ``S`` of one and two players."""
    z = keep.double()
    valid = torch.arange(z.shape[2], device=z.device)[None, :] < counts[:, None]
    out = (1.0 - z) * valid[:, None, :]  # [B, K, M]: the player is not in the coalition
    size = z.sum(dim=2)  # [B, K]
    m = counts.double()[:, None]
    a = weight * y

    def w(order: int, inside: int) -> torch.Tensor:
        """``weight_k y_k m_s(|U_k| - inside)`` ``[B, K]``."""
        return a * torch.exp(_log_weight(order, m, size - inside))

    sv = torch.einsum("bk,bki->bi", w(1, 1), z) - torch.einsum("bk,bki->bi", w(1, 0), out)
    cross = torch.einsum("bki,bk,bkj->bij", z, w(2, 1), out)  # i in U, j not
    sii = torch.einsum("bki,bk,bkj->bij", z, w(2, 2), z) - cross - cross.transpose(1, 2) + torch.einsum("bki,bk,bkj->bij", out, w(2, 0), out)
    eye = torch.eye(z.shape[2], dtype=torch.bool, device=z.device)
    return sv, sii.masked_fill(eye, 0.0)


@register(
    "shapley_interactions",
    family="perturbation",
    cost="1 + min(n_samples, 2^M) forwards (batched; M removable tokens)",
    passes=_passes,
)
def shapley_interactions(
    problem: Problem,
    *,
    n_samples: Annotated[int, AT_LEAST_TWO] = 1024,
    top_pairs: Annotated[int, NON_NEGATIVE] = 10,
    removal: Removal = "auto",
    output: Output = "probability",
    seed: int | None = 0,
    precision: SampledPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Order-2 k-SII per token, with the strongest Shapley interactions between token pairs in the details.

    Scores ``[B, N]``: ``k-SII_i = phi_i - 1/2 sum_{j != i} SII_ij`` for each removable token
    (0 elsewhere), where ``phi_i`` is its Shapley value and ``SII_ij`` the Shapley interaction
    index of the pair (module docstring). With the pairs' ``SII_ij`` they decompose the output
    exactly, ``sum_i k-SII_i + sum_{i<j} SII_ij = v(N) - v(empty)`` (k-SII is efficient):
    the scores are what each token adds alone once what it does together with another token is
    counted with the pair. ``details["interactions"]``: the ``top_pairs`` pairs of largest
    ``|SII_ij|``, each ``{"positions": [i, j], "tokens": [...], "value": SII_ij}``;
    ``details["exact"]``: whether every coalition was evaluated.

    It optimises no evaluation metric: it computes an axiomatic index (Bordt & von Luxburg 2023,
    Def. 3.2 with Eq. 3.1 for ``k = 2``; SII: Grabisch & Roubens 1999). Estimator: SHAP-IQ
    (Fumagalli et al. 2023, Theorem 4.1), unbiased, from ``n_samples`` coalitions per text --
    the sizes whose coalitions all fit the budget enumerated whole from the outside in, the
    others sampled with KernelSHAP's size distribution -- and exact once ``n_samples >= 2^M``.
    Its error shrinks as ``1/sqrt(R)`` in the ``R`` sampled coalitions; 1024 (ours) is exact up
    to 10 tokens. ``removal`` and ``output`` as KernelSHAP's.

    Cost: ``min(n_samples, 2^M)`` distinct coalitions per text (repeated draws run once), one
    batched, chunked set of forwards.

    Source: Bordt & von Luxburg 2023, From Shapley Values to Generalized Additive Models and Back
    (AISTATS), k-SII; Fumagalli et al. 2023, SHAP-IQ: Unified Approximation of any-order Shapley
    Interactions (NeurIPS), the sampling estimator
    """
    batch = problem.batch
    features = features_of(batch, problem.target)
    gens = example_generators(batch, seed)
    counts = features.counts.cpu()
    drawn = [coalitions(m, n_samples, g) for m, g in zip(counts.tolist(), gens, strict=True)]
    bsz, width = features.positions.shape
    most = max(len(k) for k, _ in drawn)
    device = features.valid.device
    keep = torch.zeros(bsz, most, width, dtype=torch.bool, device=device)
    weight = torch.zeros(bsz, most, dtype=torch.float64, device=device)
    for b, (k, w) in enumerate(drawn):
        keep[b, : len(k), : k.shape[1]] = k.to(device)  # padding rows: the empty coalition again, weight 0
        weight[b, : len(w)] = w.to(device)
    with forward_precision(precision):
        v = score_samples(problem, features, keep, removal, output, internal_batch_size).double()
    y = v - v[:, :1]  # the empty coalition comes first
    sv, sii = interaction_indices(keep, y, weight, features.counts.to(device))
    ksii = sv - 0.5 * sii.sum(dim=2)
    problem.details.update(_details(problem, features, sii, n_samples, top_pairs))
    return to_tokens(features, ksii.to(problem.reference.logits.dtype), batch.seq_len)


def _details(problem: Problem, features: Features, sii: torch.Tensor, budget: int, top_pairs: int) -> dict[str, list]:
    """Each example's ``top_pairs`` strongest pairs and whether its indices are exact."""
    batch = problem.batch
    pairs, exact = [], []
    for b, m in enumerate(features.counts.tolist()):
        exact.append(not plan_sizes(m, budget)[1])
        upper = torch.triu(torch.ones(m, m, dtype=torch.bool, device=sii.device), diagonal=1)
        i, j = upper.nonzero(as_tuple=True)
        values = sii[b, i, j]
        order = values.abs().argsort(descending=True, stable=True)[:top_pairs]
        n = int(batch.lengths[b])
        readable = problem.adapter.readable_tokens(batch.input_ids[b, :n].tolist(), batch.tokens[b])
        found = []
        for k in order.tolist():
            p, q = int(features.positions[b, i[k]]), int(features.positions[b, j[k]])
            found.append({"positions": [p, q], "tokens": [readable[p], readable[q]], "value": float(values[k])})
        pairs.append(found)
    return {"interactions": pairs, "exact": exact}
