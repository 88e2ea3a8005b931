"""shapley_interactions against the exact indices: every coalition of at most 10 tokens evaluated
on the raw transformers model, the Shapley value, the Shapley interaction index and k-SII
written from their definitions as plain loops over subsets; below 2^M coalitions, the estimate
within its sampling error, computed exactly from the same enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import cached_model
from test_oracles import Alone, assert_matches

import heedful


class Game:
    """``v(U)``: the explained probability with the removable tokens ``U`` kept, the others
    ``[MASK]``ed (encoders) or deleted (decoders; nothing left: the pad token alone), by hand."""

    def __init__(self, model, text: str) -> None:
        self.one = one = Alone(model, text)
        self.players = [i for i in range(one.n) if not one.special[i]]
        self.m = len(self.players)
        self.values = {}
        for size in range(self.m + 1):
            for kept in itertools.combinations(range(self.m), size):
                self.values[frozenset(kept)] = self.prob(frozenset(self.players[k] for k in kept))

    def prob(self, kept: frozenset[int]) -> float:
        one = self.one
        ids = one.ids[0].tolist()
        if one.is_encoder:
            run = [t if (one.special[i] or i in kept) else one.tok.mask_token_id for i, t in enumerate(ids)]
            anchor = one.anchor
        else:
            run = [t for i, t in enumerate(ids) if one.special[i] or i in kept] or [one.tok.pad_token_id]
            anchor = len(run) - 1
        with torch.no_grad():
            logits = one.hf(input_ids=torch.tensor([run])).logits[0]
        row = logits[anchor] if logits.dim() == 2 else logits
        return float(torch.softmax(row.double(), -1)[one.label])

    def v(self, kept) -> float:
        return self.values[frozenset(kept)]

    def shapley(self, i: int) -> float:
        m, others = self.m, [k for k in range(self.m) if k != i]
        return sum(
            math.factorial(len(t)) * math.factorial(m - len(t) - 1) / math.factorial(m) * (self.v({*t, i}) - self.v(t))
            for size in range(m)
            for t in itertools.combinations(others, size)
        )

    def sii(self, i: int, j: int) -> float:
        m, others = self.m, [k for k in range(self.m) if k not in (i, j)]
        return sum(
            math.factorial(len(t)) * math.factorial(m - len(t) - 2) / math.factorial(m - 1)
            * (self.v({*t, i, j}) - self.v({*t, i}) - self.v({*t, j}) + self.v(t))
            for size in range(m - 1)
            for t in itertools.combinations(others, size)
        )

    def exact(self) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
        """k-SII per player (``phi_i - 1/2 sum_j SII_ij``) and ``SII_ij`` per pair of players."""
        pairs = {(i, j): self.sii(i, j) for i, j in itertools.combinations(range(self.m), 2)}
        ksii = [self.shapley(i) - 0.5 * sum(v for p, v in pairs.items() if i in p) for i in range(self.m)]
        return np.array(ksii), pairs


def _ours(e, game: Game) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """heedful's k-SII per player and SII per pair of players (from the details' pairs)."""
    index = {p: k for k, p in enumerate(game.players)}
    pairs = {tuple(sorted((index[a], index[b]))): d["value"] for d in e.details["interactions"] for a, b in [d["positions"]]}
    return np.array([e.scores[p] for p in game.players]), pairs


TEXTS = {"bert": ("a bad film", "good fun"), "llama": ("a bad film", "so good")}


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_shapley_interactions_with_every_coalition_equal_the_exact_indices(family):
    model = cached_model(family, "classification")
    games = [Game(model, t) for t in TEXTS[family]]
    assert all(3 <= g.m <= 10 for g in games), [g.m for g in games]
    found = model.explain(list(TEXTS[family]), "shapley_interactions", n_samples=1024, top_pairs=45)
    for e, g in zip(found, games, strict=True):
        assert e.details["exact"]
        ksii, pairs = g.exact()
        ours, our_pairs = _ours(e, g)
        scale = max(np.abs(ksii).max(), max(abs(v) for v in pairs.values()))
        assert_matches(ours, ksii, f"k-SII {family} {e.text!r}", scale=scale)
        assert set(our_pairs) == set(pairs)
        assert_matches([our_pairs[p] for p in pairs], list(pairs.values()), f"SII {family} {e.text!r}", scale=scale)
        # efficiency: tokens and pairs decompose v(N) - v(empty)
        total = g.v(range(g.m)) - g.v(())
        assert abs(ours.sum() + sum(our_pairs.values()) - total) <= 1e-5 * max(abs(total), scale)


def _sampling_sd(game: Game, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The standard deviation of the SHAP-IQ estimate of every player's k-SII and every pair's SII
    with ``budget`` coalitions: the sizes enumerated whole (pairs ``u, M - u`` from the outside
    in while they fit) are exact; each of the ``R`` draws from the others (size ``u`` with
    probability proportional to ``1 / (u (M - u))``, members uniform) adds ``y(U) c(U) / p(U)``,
    of variance ``sum_U p(U) (y c / p)^2 - (sum_U y c)^2`` (``y = v - v(empty)``, ``c`` the
    index's coefficient of ``U``), divided by ``R``."""
    m = game.m
    whole, used = set(), 0
    for u in range(m // 2 + 1):
        count = sum(math.comb(m, s) for s in {u, m - u})
        if used + count > budget:
            break
        whole |= {u, m - u}
        used += count
    left = [u for u in range(m + 1) if u not in whole]
    draws = budget - used
    mass = {u: 1 / (u * (m - u)) for u in left}
    total = sum(mass.values())

    def c(order: int, size: int, inside: int) -> float:
        t = size - inside
        if t < 0 or t > m - order:
            return 0.0
        return (-1) ** (order - inside) * math.factorial(t) * math.factorial(m - t - order) / math.factorial(m - order + 1)

    pairs = list(itertools.combinations(range(m), 2))
    first = np.zeros(m + len(pairs))
    second = np.zeros(m + len(pairs))
    for size in left:
        p = mass[size] / total / math.comb(m, size)
        for kept in itertools.combinations(range(m), size):
            y = game.v(kept) - game.v(())
            s = set(kept)
            sii = {(i, j): c(2, size, (i in s) + (j in s)) for i, j in pairs}
            coef = [c(1, size, i in s) - 0.5 * sum(v for q, v in sii.items() if i in q) for i in range(m)]
            coef += [sii[q] for q in pairs]
            x = y * np.array(coef) / p
            first += p * x
            second += p * x**2
    sd = np.sqrt(np.maximum(second - first**2, 0) / draws)
    return sd[:m], sd[m:], draws


SEEDS = 12


@pytest.mark.parametrize(("family", "text", "budget"), [("llama", "the film is bad", 768), ("bert", "good fun", 96)])
def test_shapley_interactions_sampled_stay_within_their_sampling_error_of_the_exact_indices(family, text, budget):
    """Below 2^M coalitions the estimate is unbiased: each seed's error, and the error of the mean
    over SEEDS independent seeds, within 4.5 standard deviations (the mean's: / sqrt(SEEDS))."""
    model = cached_model(family, "classification")
    game = Game(model, text)
    assert 6 <= game.m <= 10 and budget < 2**game.m, game.m
    ksii, pairs = game.exact()
    exact = np.concatenate([ksii, list(pairs.values())])
    sd_tokens, sd_pairs, draws = _sampling_sd(game, budget)
    sd = np.concatenate([sd_tokens, sd_pairs])
    assert draws > 0 and sd.max() > 0
    found = []
    for seed in range(SEEDS):
        e = model.explain(text, "shapley_interactions", n_samples=budget, top_pairs=45, seed=seed)
        assert not e.details["exact"]
        ours, our_pairs = _ours(e, game)
        found.append(np.concatenate([ours, [our_pairs[p] for p in pairs]]))
    floor = 1e-6 * np.abs(exact).max()
    for what, estimate, spread in [("seed 0", found[0], sd), (f"mean of {SEEDS} seeds", np.mean(found, axis=0), sd / SEEDS**0.5)]:
        error = np.abs(estimate - exact)
        assert error.max() > 0, "the sampled estimate is exact: the test proves nothing about sampling"
        worst = int(np.argmax(error / (spread + floor)))
        assert (error <= 4.5 * spread + floor).all(), f"{what}, index {worst}: error {error[worst]:.3g} > 4.5 sd {4.5 * spread[worst]:.3g}"


def test_shapley_interactions_report_the_coalitions_they_run():
    model = cached_model("bert", "classification")
    e = model.explain("a bad film", "shapley_interactions", n_samples=4096)
    m = Game(model, "a bad film").m
    assert e.cost.forward_passes == 1 + 2**m  # the reference and every distinct coalition once


def test_shapley_interactions_refuse_one_sample_in_one_line():
    with pytest.raises(heedful.InputError, match="n_samples=1"):
        cached_model("bert", "classification").explain("a bad film", "shapley_interactions", n_samples=1)
