"""The best ranking a removal curve can reward: the exact maximum of AOPC (or minimum of
sufficiency) over every ordering of a text's tokens, found by dynamic programming over subsets.

A removal curve reads an explanation only through its ranking: at ratio ``r`` it removes the
top ``s_r`` tokens (:func:`~heedful.evaluate.perturbation.rationale_sizes`) and watches the
output ``f``. An ordering ``o_1 .. o_M`` of the ``M`` eligible tokens is a chain of nested sets
``S_k = {o_1 .. o_k}``, and its AOPC is

    ``AOPC(o) = (1 / |R|) sum_{r in R} [f(x) - f(x without S_{s_r})]``

over the ratios ``R`` the protocol averages. The best chain obeys the recursion

    ``best(S) = w_{|S|} (f(x) - f(x without S)) + max_{i in S} best(S - {i})``,  ``best({}) = w_0 * 0``,

with ``w_k`` the number of averaged ratios whose size is ``k``; ``best(E) / |R|`` for the whole
eligible set ``E`` is the largest AOPC any explanation can score on that text under that
protocol, and backtracking the maximisers gives an ordering that scores it. Sufficiency (keep
only ``S``, the rest of the rankable tokens removed) is the same recursion with ``min``. It
takes one forward pass per subset whose size some ratio uses -- at most ``2^M`` -- so it runs on
short texts only (``max_tokens``, 14 by default: at most 16,384 passes).

What it is for: a faithfulness number is read against a scale whose top is unknown. The ceiling
puts it there -- how much of the reachable AOPC a method reaches, and whether a margin over
another method is reachable at all (``benchmarks/aopc_ceiling.py``). It is exact for the
protocol's own operator and schedule only; under another operator the same ordering is no
longer optimal.

Source: the removal curves of Samek et al. 2017 (AOPC) and DeYoung et al. 2020
(comprehensiveness, sufficiency); the search over orderings that solves them, Zhou & Shah 2023
(which searches it with a beam, :func:`heedful.attribution.solvability.solvability_beam`); the
recursion is the Held-Karp subset dynamic programme (1962) applied to that search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch

from heedful.errors import InputError
from heedful.evaluate.perturbation import Prepared, forward_removed, prepare, rationale_sizes
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.explanation import Cost, Explanation
from heedful.progress import task

MAX_TOKENS = 14
"""Texts with more eligible tokens than this are left out by default (``2^14`` subsets)."""
CeilingMetric = Literal["aopc", "sufficiency"]


@dataclass
class Ceiling:
    """The best orderings of some texts: ``values`` ``[B]`` (the AOPC -- or sufficiency -- each
    scores, NaN for a text left out), ``explanations`` (the ordering as ranks, ``M`` for the
    first token removed down to 1, 0 elsewhere; ``None`` for a text left out) and the forward
    passes each took ``[B]``."""

    values: np.ndarray
    explanations: list[Explanation | None]
    forwards: np.ndarray


def subset_weights(sizes: torch.Tensor, counted: torch.Tensor, tokens: int) -> np.ndarray:
    """``w_k`` ``[tokens + 1]``: how many counted ratios remove ``k`` tokens (``sizes``, ``counted`` ``[R]``)."""
    return np.bincount(sizes[counted].numpy(), minlength=tokens + 1)[: tokens + 1].astype(np.float64)


def popcounts(tokens: int) -> np.ndarray:
    """How many items each bitmask ``0 .. 2^tokens - 1`` holds ``[2^tokens]``."""
    masks = np.arange(1 << tokens)
    return sum(((masks >> i) & 1 for i in range(tokens)), np.zeros(1 << tokens, dtype=np.int64))


def best_chain(gains: np.ndarray, tokens: int, maximise: bool = True) -> tuple[float, list[int]]:
    """The chain ``{} = S_0 < S_1 < .. < S_M`` of the ``M = tokens`` items with the largest (or
    smallest) sum of ``gains[S_k]`` (``[2^M]``, indexed by bitmask; what the chain collects at
    each set) and the order the items enter it. Vectorised per set size: each set's best is its
    gain plus the best over the sets one item smaller."""
    best = np.full(1 << tokens, -np.inf if maximise else np.inf)
    best[0] = gains[0]
    masks, popcount = np.arange(1 << tokens), popcounts(tokens)
    bits = 1 << np.arange(tokens)
    pick = np.nanargmax if maximise else np.nanargmin
    for k in range(1, tokens + 1):
        sets = masks[popcount == k]
        members = (sets[:, None] & bits[None, :]) != 0  # [S, M]
        below = np.where(members, best[sets[:, None] ^ bits[None, :]], np.nan)
        best[sets] = gains[sets] + below[np.arange(len(sets)), pick(below, axis=1)]
    order, current = [], (1 << tokens) - 1
    while current:
        members = np.flatnonzero(current & bits)
        below = best[current ^ bits[members]]
        last = int(members[pick(below)])
        order.append(last)
        current ^= 1 << last
    return float(best[-1]), order[::-1]


def _one(prepared: Prepared, b: int, metric: CeilingMetric, sizes: torch.Tensor, counted: torch.Tensor, chunk: int | None,
         pool: int | None = None) -> tuple[float, np.ndarray, int]:
    """Example ``b``'s best value, its ranks ``[N]`` and the forward passes it took; with ``pool``
    the search reorders the explanation's top ``pool`` tokens and keeps the rest in its order."""
    eligible = prepared.eligible[b].nonzero().flatten()
    ranked = eligible[torch.argsort(prepared.ranks[b][eligible], stable=True)]  # the explanation's order
    free, fixed = (eligible, ranked[:0]) if pool is None else (ranked[:pool], ranked[pool:])
    tokens = len(free)
    weights = subset_weights(sizes, counted, len(eligible))
    popcount = popcounts(tokens)
    needed = np.flatnonzero(weights[popcount] > 0)
    tail = np.flatnonzero(weights[tokens + 1 :] > 0) + tokens + 1  # sizes past the reordered tokens: fixed sets
    width = prepared.batch.seq_len
    top = torch.zeros(len(needed) + len(tail), width, dtype=torch.bool)
    top[: len(needed), free] = torch.from_numpy(((needed[:, None] >> np.arange(tokens)[None, :]) & 1).astype(bool))  # [S, M]
    for row, size in enumerate(tail, start=len(needed)):
        top[row, torch.cat([free, fixed[: size - tokens]])] = True
    remove = top if metric == "aopc" else prepared.rankable[b][None, :] & ~top
    ex = torch.full((len(top),), b, dtype=torch.long)
    outputs = forward_removed(prepared, ex, remove, prepared.protocol.removal, chunk).output.astype(np.float64)
    drops = float(prepared.original.output[b]) - outputs
    gains = np.zeros(1 << tokens)
    gains[needed] = weights[popcount[needed]] * drops[: len(needed)]
    total, order = best_chain(gains, tokens, maximise=metric == "aopc")
    total += float(np.sum(weights[tail] * drops[len(needed) :]))
    ranks = np.zeros(width)
    ranks[torch.cat([free[order], fixed]).numpy()] = np.arange(len(eligible), 0, -1)
    return total / counted.sum().item(), ranks, len(top)


def aopc_ceiling(
    model,
    explanations: Sequence[Explanation],
    protocol: str | Protocol | None = None,
    *,
    metric: CeilingMetric = "aopc",
    max_tokens: int = MAX_TOKENS,
    chunk: int | None = None,
    pool: int | None = None,
) -> Ceiling:
    """The best ordering of each explained text and the AOPC (``metric="sufficiency"``: the
    sufficiency) it scores under ``protocol`` -- the ceiling no explanation of that text can
    pass. ``explanations`` give the texts and the explained outputs (any method's: only the
    ranking is replaced); a text with more than ``max_tokens`` eligible tokens is left out.
    Cost: one forward pass per subset of the eligible tokens whose size a ratio uses.

    ``pool=P`` searches every text, whatever its length, but only over the orderings that keep
    the explanation's choice of its top ``P`` tokens and its order of the rest: the best
    reordering of its top ``P`` (``max_tokens`` then does not apply). That value bounds what
    reordering the explanation's own candidates can gain -- a lower bound of the ceiling, exact
    when ``P`` covers every eligible token. Cost: one pass per subset of the ``P`` tokens whose
    size a ratio uses, and one per ratio past ``P``.

    >>> from heedful.evaluate import evaluate
    >>> from heedful.tiny_models import tiny_model
    >>> model = tiny_model("bert")
    >>> found = model.explain(["a fine film"], "saliency")
    >>> ceiling = aopc_ceiling(model, found)
    >>> best = evaluate(model, ceiling.explanations, "aopc")["aopc"].per_example.values[0]
    >>> saliency = evaluate(model, found, "aopc")["aopc"].per_example.values[0]
    >>> bool(abs(best - ceiling.values[0]) < 1e-6 and best >= saliency - 1e-6)
    True
    """
    if metric not in ("aopc", "sufficiency"):
        raise InputError(f"unknown ceiling metric {metric!r}", hint="use 'aopc' or 'sufficiency'")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 20:
        raise InputError(f"max_tokens must be a whole number from 1 to 20, got {max_tokens!r}", hint="2^max_tokens forward passes per text")
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or not 1 <= pool <= 20):
        raise InputError(f"pool must be a whole number from 1 to 20, got {pool!r}", hint="2^pool forward passes per text at most")
    adapter = getattr(model, "adapter", model)
    protocol = get_protocol(protocol).resolved(adapter.device)
    if protocol.only_positive or protocol.skip_repeated or protocol.schedule == "linspace" or protocol.retokenize:
        raise InputError(f"protocol {protocol.name!r} rewards more than a ranking", hint="use a protocol like 'default' or 'normxlogit'")
    prepared = prepare(adapter, explanations, protocol, chunk)
    _, sizes, valid = rationale_sizes(prepared)
    counted = valid & torch.from_numpy(protocol.mean_mask)[None, :]
    values = np.full(len(explanations), np.nan)
    forwards = np.zeros(len(explanations), dtype=np.int64)
    found: list[Explanation | None] = [None] * len(explanations)
    eligible = prepared.eligible.sum(dim=1)
    longest = max_tokens if pool is None else int(eligible.max()) if len(eligible) else 0
    todo = [b for b in range(len(explanations)) if 0 < int(eligible[b]) <= longest and counted[b].any()]
    with task(f"{metric} ceiling ({len(todo)} of {len(explanations)} texts)", total=len(todo)) as steps:
        for b in todo:
            values[b], ranks, forwards[b] = _one(prepared, b, metric, sizes[b], counted[b], chunk, pool)
            source = explanations[b]
            found[b] = replace(
                source, scores=ranks[: len(source.tokens)], method=f"{metric}_ceiling",
                options={"protocol": protocol.name, **({"pool": pool, "of": source.method} if pool is not None else {})},
                cost=Cost(0.0, float(forwards[b]), 0.0), details={},
            )
            steps.advance()
    return Ceiling(values, found, forwards)
