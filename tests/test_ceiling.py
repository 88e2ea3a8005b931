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
