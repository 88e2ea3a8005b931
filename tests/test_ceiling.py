"""heedful.evaluate.ceiling: the best ordering by dynamic programming over subsets is the best of
every ordering tried one by one, scored by the evaluation it claims to solve."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from heedful.errors import InputError
from heedful.evaluate import evaluate
from heedful.evaluate.ceiling import aopc_ceiling, best_chain
from heedful.tiny_models import tiny_model

TEXTS = ["a film", "good"]
"""At most six tokens on either tiny tokenizer (special ones included): 720 orderings at most."""


@pytest.fixture(scope="module", params=["bert", "llama"])
def model(request):
    return tiny_model(request.param)


def every_ordering(explanation):
    """One copy of ``explanation`` per ordering of all its tokens (ranks as scores; the protocol
    decides which of them it may remove)."""
    copies = []
    for order in itertools.permutations(range(len(explanation.tokens))):
        scores = np.zeros(len(explanation.tokens))
        scores[list(order)] = np.arange(len(order), 0, -1)
        copies.append(type(explanation)(**{**explanation.__dict__, "scores": scores}))
    return copies


@pytest.mark.parametrize("metric", ["aopc", "sufficiency"])
def test_the_ceiling_is_the_best_of_every_ordering(model, metric):
    found = model.explain(TEXTS, "random")
    ceiling = aopc_ceiling(model, found, metric=metric)
    for b, explanation in enumerate(found):
        tried = evaluate(model, every_ordering(explanation), metric)[metric].per_example.values
        best = tried.max() if metric == "aopc" else tried.min()
        assert ceiling.values[b] == pytest.approx(best, abs=1e-6)
        scored = evaluate(model, [ceiling.explanations[b]], metric)[metric].per_example.values[0]
        assert scored == pytest.approx(ceiling.values[b], abs=1e-6)  # the ordering it returns scores it
        assert ceiling.forwards[b] <= 2 ** int(ceiling.explanations[b].scores.max())


def test_best_chain_against_every_permutation():
    rng = np.random.default_rng(0)
    for tokens in range(1, 7):
        gains = rng.normal(size=1 << tokens)
        gains[rng.random(1 << tokens) < 0.3] = 0.0  # sizes no ratio uses collect nothing
        for maximise in (True, False):
            totals = {}
            for order in itertools.permutations(range(tokens)):
                mask, total = 0, gains[0]
                for item in order:
                    mask |= 1 << item
                    total += gains[mask]
                totals[order] = total
            value, order = best_chain(gains, tokens, maximise)
            best = max(totals.values()) if maximise else min(totals.values())
            assert value == pytest.approx(best) and totals[tuple(order)] == pytest.approx(best)


def test_long_texts_are_left_out_and_bad_settings_refused(model):
    found = model.explain(["a film", "the long and winding road that leads to your door"], "random")
    ceiling = aopc_ceiling(model, found, max_tokens=6)
    assert np.isfinite(ceiling.values[0]) and np.isnan(ceiling.values[1]) and ceiling.explanations[1] is None
    with pytest.raises(InputError, match="max_tokens"):
        aopc_ceiling(model, found, max_tokens=40)
    with pytest.raises(InputError, match="rewards more than a ranking"):
        aopc_ceiling(model, found, "ferret")
    with pytest.raises(InputError, match="ceiling metric"):
        aopc_ceiling(model, found, metric="log_odds")


def test_the_documented_example_runs():
    import doctest

    import heedful.evaluate.ceiling

    outcome = doctest.testmod(heedful.evaluate.ceiling)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_a_pooled_search_is_the_best_reordering_of_the_explanations_top_tokens(model):
    """Every ordering that puts the explanation's top ``P`` tokens first (in any order) and keeps
    its order of the rest, scored by ``evaluate``: the pooled search returns the best of them,
    and with ``P`` covering every token it is the exact ceiling."""
    found = model.explain(["good", "a film"], "random")
    exact = aopc_ceiling(model, found)
    for pool in (2, 3):
        pooled = aopc_ceiling(model, found, pool=pool)
        for b, explanation in enumerate(found):
            eligible = np.flatnonzero(np.asarray(pooled.explanations[b].scores) > 0)
            scores = np.asarray(explanation.scores, dtype=float)
            order = eligible[np.argsort(-scores[eligible], kind="stable")]
            tried = []
            for head in itertools.permutations(order[:pool]):
                ranks = np.zeros(len(scores))
                ranks[[*head, *order[pool:]]] = np.arange(len(order), 0, -1)
                tried.append(type(explanation)(**{**explanation.__dict__, "scores": ranks}))
            values = evaluate(model, tried, "aopc")["aopc"].per_example.values
            assert pooled.values[b] == pytest.approx(values.max(), abs=1e-6)
            scored = evaluate(model, [pooled.explanations[b]], "aopc")["aopc"].per_example.values[0]
            assert scored == pytest.approx(pooled.values[b], abs=1e-6)  # the ordering it returns scores it
            own = evaluate(model, [explanation], "aopc")["aopc"].per_example.values[0]
            assert own - 1e-6 <= pooled.values[b] <= exact.values[b] + 1e-6  # its own order is one of those tried
    whole = aopc_ceiling(model, found, pool=20)
    np.testing.assert_allclose(whole.values, exact.values, atol=1e-6)


def test_a_pool_out_of_range_is_refused(model):
    found = model.explain(["good"], "random")
    for bad in (0, 21, 2.5, True):
        with pytest.raises(InputError, match="pool must be"):
            aopc_ceiling(model, found, pool=bad)
