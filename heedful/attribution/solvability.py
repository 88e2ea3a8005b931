"""An explanation that solves the removal metric it is scored by: the beam search of Zhou & Shah
(2023) over token orderings, each ordering scored by the comprehensiveness and/or sufficiency
curve it produces (:mod:`heedful.engine.ablation` runs every removal batched)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import torch

from heedful.attribution.composed import method_scores, named_method, usable_method
from heedful.engine.ablation import removal_drops
from heedful.engine.options import AT_LEAST_ONE, KEYED_WHEN_SET, RUNTIME
from heedful.engine.perturb import Removal, removable_positions, removal_id
from heedful.engine.problem import Problem
from heedful.engine.workload import passes
from heedful.errors import InputError
from heedful.progress import task
from heedful.registry import register

Objective = Literal["comprehensiveness", "sufficiency", "both"]


def beam_forwards(
    beam: int,
    tokens: int,
    objective: str,
    shortlist: int | None = None,
    prior: bool = False,
    operators: int = 1,
    refresh: int | None = None,
) -> int:
    """Forward passes the search runs for ``tokens`` removable tokens (the reference and a prior
    method's passes excluded): at step ``t`` (a prefix of ``t`` tokens chosen) each of the
    ``min(beam, tokens!/(tokens-t)!)`` live orderings tries the ``tokens - t`` tokens left --
    at most ``shortlist`` of them at a lazy step (:func:`lazy_step`) -- one removal each (two
    for ``"both"``) under each of the ``operators`` removal operators the objective sums; the
    step that has one token left runs nothing (its prefix is the whole text for every beam)."""
    total, alive = 0, 1
    for t in range(tokens - 1):
        left = tokens - t
        total += alive * (min(shortlist, left) if lazy_step(t, shortlist, prior, refresh) else left)
        alive = min(beam, alive * left)
    return total * (2 if objective == "both" else 1) * operators


def lazy_step(t: int, shortlist: int | None, prior: bool, refresh: int | None) -> bool:
    """Whether step ``t`` measures only a shortlist: with a ``shortlist``, every step but the
    first (the first too with a ``prior`` ranking) and the steps ``refresh``, ``2 refresh``, ...
    that measure every token left again."""
    if shortlist is None or (t == 0 and not prior):
        return False
    return not (refresh is not None and t > 0 and t % refresh == 0)


def _passes(options: Mapping[str, Any], tokens: int) -> tuple[float, float]:
    prior = None if options.get("prior") is None else named_method(options["prior"], "prior")
    forward, backward = (0.0, 0.0) if prior is None else passes(prior, prior.defaults, tokens)
    operators = 1 if options.get("also_removal") is None else 2
    searched = beam_forwards(
        options["beam"], tokens, options["objective"], options["shortlist"], prior is not None, operators, options.get("refresh")
    )
    return (1 + searched + forward, backward)


def _shortlist(valid: torch.Tensor, last: torch.Tensor, size: int, known: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor:
    """``[B, W, N]`` bool: the ``size`` tokens each live ordering re-measures, among its
    ``valid`` ones: those whose ``last`` measured gain is largest; with a ``prior`` ranking
    (``[B, N]``, higher first), every token measured before (``known``) ahead of every token
    never measured, which follow in the prior's order."""
    width = valid.shape[2]
    if prior is None:
        stale = torch.where(valid, last, torch.full_like(last, -math.inf))
        listed = stale.topk(min(size, width), dim=2).indices
    else:  # two stable sorts: by the prior's order, then (stably) by the measured gain, never measured last
        by_prior = torch.where(valid, prior[:, None, :].expand_as(last), torch.full_like(last, -math.inf))
        ranked = by_prior.argsort(dim=2, descending=True, stable=True)
        gain = torch.where(valid & known, last, torch.full_like(last, -math.inf)).gather(2, ranked)
        listed = ranked.gather(2, gain.argsort(dim=2, descending=True, stable=True))[..., : min(size, width)]
    return valid & torch.zeros_like(valid).scatter_(2, listed, True)


@register(
    "solvability_beam",
    family="perturbation",
    cost=(
        "1 + ~beam * N^2 / 2 forwards (x2 for objective='both', x2 with also_removal; N + beam * shortlist * N "
        "with a shortlist, beam * shortlist * N + the prior method's passes with a prior, plus every token left at "
        "each refresh; batched per step)"
    ),
    passes=_passes,
)
@torch.no_grad()
def solvability_beam(
    problem: Problem,
    *,
    beam: Annotated[int, AT_LEAST_ONE] = 4,
    objective: Objective = "comprehensiveness",
    shortlist: Annotated[int | None, AT_LEAST_ONE, KEYED_WHEN_SET] = None,
    trailing_specials: Annotated[bool, KEYED_WHEN_SET] = False,
    prior: Annotated[str | None, KEYED_WHEN_SET] = None,
    refresh: Annotated[int | None, AT_LEAST_ONE, KEYED_WHEN_SET] = None,
    removal: Removal = "auto",
    also_removal: Annotated[Removal | None, KEYED_WHEN_SET] = None,
    output: Literal["logit", "probability"] = "probability",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Token ranks of the ordering a beam search finds to maximise comprehensiveness and/or minimise sufficiency.

    The explanation is an ordering ``o`` of the ``M`` removable tokens, and it directly optimises
    a removal metric. ``objective="comprehensiveness"`` maximises the AOPC of the
    deletion curve ``sum_k f(x) - f(x without o_1..o_k)``; ``"sufficiency"`` minimises that of the
    keep curve ``sum_k f(x) - f(x with only o_1..o_k)``; ``"both"`` maximises their difference
    (comprehensiveness minus sufficiency, the paper's combined target). The orderings are built
    one token at a time: at each step every one of the ``beam`` best prefixes is extended by each
    token it lacks, each extension scored by its prefix's curve so far plus the output drop of
    its new prefix removed (or kept), all extensions of all examples in one batched
    :func:`~heedful.engine.ablation.removal_drops`; the ``beam`` best extensions survive.
    ``beam=1`` is the greedy search; a beam of ``M!`` is exhaustive.

    ``shortlist=L`` makes the search lazy (the accelerated greedy of Minoux 1978): the first step
    measures every token, and from then on each live ordering re-measures only the ``L`` tokens
    left whose gain it measured last was largest (a token not re-measured keeps its older
    gain, inherited from the ordering's parent, for the next shortlist; only re-measured tokens
    can extend the ordering at this step). The bet is that a token whose removal mattered before
    still matters once the next one is removed; it costs ``M + beam * L * M`` forwards instead of
    ``beam * M^2 / 2`` -- with ``beam=1, shortlist=4`` about a tenth of the default search's
    passes on 25-token sentences -- and ``benchmarks/frontier.py`` measures how much of the full
    search's AOPC it keeps. A heuristic: the curves are not submodular, so a token can gain
    after others are gone and be missed; ``shortlist >= M`` is the full search.

    ``prior="attnlrp"`` (any registered method of the model's task, at its defaults) spares the
    lazy search its first step's ``M`` removals: the prior method's scores order the tokens,
    the first step measures only the ``L`` it ranks highest, and at every later step the tokens
    measured before come first in the shortlist (by the gain last measured) and the tokens never
    measured follow in the prior's order -- as one token is placed per step, each step measures
    about one token the search has not measured yet, the next the prior ranks. It costs
    ``beam * L * M`` forwards plus the prior's passes (AttnLRP: a forward and a backward); it
    needs a ``shortlist``. On minilm-sentiment's 500 frontier sentences, ``beam=1, shortlist=6,
    prior="attnlrp"`` (with ``trailing_specials``) kept 96.6 % of the full search's AOPC [MASK]
    at 150 forward-pass equivalents per sentence, under a tenth of the full search's 1,694, where
    ``shortlist=5`` without a prior kept 94.2 % at 147 (``docs/results/frontier.md``).

    ``refresh=R`` bounds how stale a lazy search's gains get: the steps ``R``, ``2R``, ... measure
    every token left again, as the first step does, and the lazy steps between them shortlist by
    those fresh gains. Where the first tokens removed change what the rest are worth -- ``[UNK]``
    on a causal LM -- a shortlist ranked by gains measured many steps before misses the token
    the full greedy search takes; each refresh costs the tokens left, so ``refresh`` trades
    passes for a search closer to the full one. On the first 32 of smollm2-sentiment's frontier
    sentences under ``[UNK]``, ``beam=1, shortlist=4, refresh=5`` kept 95.6 % of the default
    beam's AOPC where ``shortlist=5`` kept 89.1 % (the full greedy search: 97.7 %).

    ``trailing_specials=True`` orders the special tokens after the first content token too
    (``[SEP]``, ``</s>``): the default evaluation protocol ranks and removes them like words
    (:func:`heedful.evaluate.perturbation.rankable_positions`, ``specials="leading"``), and a
    model can rely on them heavily -- replacing ``[SEP]`` moves minilm-sentiment's output more
    than most words (``benchmarks/aopc_ceiling.py``: the best orderings place it early). Off, the
    search orders the words only, and an evaluation that ranks ``[SEP]`` places it last.

    The scores are the best
    ordering as ranks, ``M - k + 1`` for the ``k``-th token (``M`` for the first), 0 for the
    tokens not ordered (special ones) ``[B, N]``: only the order carries meaning, not the gaps.

    ``f`` is the target's ``probability`` (as comprehensiveness is defined) or ``logit``;
    ``removal`` as for leave-one-out. Passes run in float32 only: a search turns small rounding
    differences between candidates into a different ordering, and the scores are its ranks.

    ``also_removal`` names a second removal operator, and the objective becomes the sum of
    both operators' curves: each extension is scored by its drop with the tokens replaced one
    way plus its drop with them replaced the other way (``removal="unk", also_removal="delete"``
    on a causal LM). A search under one operator places first the tokens whose removal that
    operator turns into an out-of-distribution input the model reacts to; the sum keeps only
    orderings that remove what the model needs under both. It costs twice the passes. On
    smollm2-sentiment's 200 frontier sentences, ``beam=1, shortlist=6, prior="attnlrp",
    objective="both", removal="unk", also_removal="delete"`` scored AOPC ``[UNK]`` 0.715 against
    KernelSHAP's 0.575, and (paired) no worse under deletion or sampled replacement, where the
    same search under ``[UNK]`` alone lost 0.175 AOPC to KernelSHAP under deletion
    (``docs/results/frontier.md``).

    Which metric it optimises: comprehensiveness (by default; sufficiency, or their difference,
    by ``objective``) under **the removal operators it is given** -- the one ``removal`` names
    (``"auto"``: ``[MASK]`` on an encoder such as minilm-sentiment, deletion on a causal LM), plus
    ``also_removal``'s when set, their curves summed -- over every prefix size ``k = 1 .. M``: the
    AOPC of a protocol with that operator (the sum of two protocols' AOPCs), up to the protocol's
    ratio schedule (protocol ``default`` averages 10 .. 90 % of all tokens). It optimises nothing
    under any other operator (sampled in-distribution replacement, say), on F-Fidelity's
    fine-tuned copy, or by soft comprehensiveness / sufficiency: scores there are what
    ``benchmarks/frontier.py`` reports beside the ones it solves, so that its gain on its own
    operators is not mistaken for faithfulness.

    Cost: ``1 + sum_{t=0}^{M-2} min(beam, M!/(M-t)!) * (M - t)`` forwards per example, about
    ``beam * M^2 / 2`` (twice that for ``"both"``, twice again with ``also_removal``; ``M - t``
    is at most ``shortlist`` at a lazy step: after the first, from the first with a ``prior``,
    but for the ``refresh`` steps), run in ``M - 1`` batched steps.

    Source: Zhou & Shah 2023, The Solvability of Interpretability Evaluation Metrics (EACL
    Findings), Sec. 3 (beam search over feature orderings); lazy steps: Minoux 1978,
    Accelerated greedy algorithms for maximizing submodular set functions
    """
    if prior is not None and shortlist is None:
        raise InputError(f"prior={prior!r} orders the shortlist of the lazy search, and no shortlist is set", hint="add shortlist=5")
    if refresh is not None and shortlist is None:
        raise InputError(f"refresh={refresh} re-measures every token in a lazy search, and no shortlist is set", hint="add shortlist=4")
    if prior == "solvability_beam":
        raise InputError("prior='solvability_beam' would run the search it orders", hint="use prior='attnlrp'")
    operators = [removal] if also_removal is None else [removal, also_removal]
    if also_removal is not None and removal_id(problem.adapter, also_removal) == removal_id(problem.adapter, removal):
        raise InputError(
            f"also_removal={also_removal!r} replaces tokens as removal={removal!r} already does on this model",
            hint="name another operator, e.g. removal='unk', also_removal='delete'",
        )
    allowed = removable_positions(problem.batch, problem.target, trailing_specials)  # [B, N]
    ranking = None if prior is None else method_scores(problem, usable_method(prior, problem, "prior")).to(torch.float64)
    bsz, width = allowed.shape
    device = allowed.device
    counts = allowed.sum(dim=1)  # M_b
    most = int(counts.max()) if bsz else 0
    used = torch.zeros(bsz, beam, width, dtype=torch.bool, device=device)  # each beam's prefix
    order = torch.zeros(bsz, beam, max(most, 1), dtype=torch.long, device=device)
    score = torch.full((bsz, beam), -math.inf, dtype=torch.float64, device=device)
    score[:, 0] = 0.0  # one live (empty) ordering to start from
    last = torch.zeros(bsz, beam, width, dtype=torch.float64, device=device)  # each token's gain as last measured
    known = torch.zeros(bsz, beam, width, dtype=torch.bool, device=device)  # measured at least once
    eye = torch.eye(width, dtype=torch.bool, device=device)
    drop = dict(output=output, rows=internal_batch_size)
    with task(f"solvability beam steps ({bsz} texts)", total=max(most - 1, 0)) as steps:
        for t in range(most):
            left = counts - t  # [B] tokens not yet placed
            valid = score.isfinite()[:, :, None] & allowed[:, None, :] & ~used  # [B, W, N]
            if lazy_step(t, shortlist, ranking is not None, refresh):  # the tokens that gained most when last measured
                valid = _shortlist(valid, last, shortlist, known, ranking)
            grown = used[:, :, None, :] | eye  # [B, W, N(new token), N]
            measured = valid & (left > 1)[:, None, None]  # the last token's step changes no ranking
            gain = torch.zeros(bsz, beam, width, dtype=torch.float64, device=device)
            if measured.any():
                curves = []  # (positions removed [B, W*N, N], sign): removing the prefix adds, keeping only it subtracts
                if objective != "sufficiency":
                    curves.append(((grown & measured[..., None]).view(bsz, -1, width), 1.0))
                if objective != "comprehensiveness":
                    curves.append(((allowed[:, None, None, :] & ~grown & measured[..., None]).view(bsz, -1, width), -1.0))
                for operator in operators:  # the objective sums every operator's curves
                    for removed, sign in curves:
                        gain += sign * removal_drops(problem, removed, removal=operator, **drop).view(bsz, beam, width).double()
                steps.advance()
            last = torch.where(measured, gain, last)
            known |= measured
            total = torch.where(valid, score[:, :, None] + gain, torch.full_like(gain, -math.inf)).view(bsz, -1)
            best = torch.sort(total, dim=1, descending=True, stable=True)  # stable: ties keep beam-then-position order
            top, index = best.values[:, :beam], best.indices[:, :beam]  # [B, W]
            parent, token = index // width, index % width
            rows = torch.arange(bsz, device=device)[:, None]
            active = (left > 0)[:, None]  # an example with every token placed keeps its beams
            used = torch.where(active[..., None], used[rows, parent] | eye[token], used)
            last = torch.where(active[..., None], last[rows, parent], last)
            known = torch.where(active[..., None], known[rows, parent], known)
            new_order = order[rows, parent]
            new_order[:, :, t] = token
            order = torch.where(active[..., None], new_order, order)
            score = torch.where(active, top, score)
    scores = torch.zeros(bsz, width + 1, dtype=problem.reference.logits.dtype, device=device)
    rank = (counts[:, None] - torch.arange(order.shape[2], device=device)[None, :]).to(scores.dtype)  # [B, M]
    placed = torch.arange(order.shape[2], device=device)[None, :] < counts[:, None]
    scores.scatter_(1, torch.where(placed, order[:, 0], width), rank)  # unplaced slots -> an extra column, cut off
    return scores[:, :width]
