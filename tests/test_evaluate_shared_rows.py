"""The faithfulness curves run each distinct row once -- the originals of one text explained by
several methods, and perturbed rows that recur across ratios or methods -- and give the values
that separate calls give."""

from __future__ import annotations

import numpy as np
import pytest
from tiny import CORPUS, tiny_model

from heedful.evaluate import evaluate

TEXTS = list(CORPUS[:5])


@pytest.fixture(scope="module")
def model():
    return tiny_model("bert", initializer_range=0.2)


@pytest.mark.parametrize("preset", ["default", "ferret"])
def test_shared_rows_run_once_with_the_same_values(model, preset):
    a = model.explain(TEXTS, "grad_x_input")
    b = model.explain(TEXTS, "saliency")
    joint = [e for pair in zip(a, b, strict=True) for e in pair]
    counter = model.adapter.counter
    counter.reset()
    separate = [evaluate(model, expl, ["aopc", "sufficiency"], preset) for expl in (a, b)]
    separate_rows = counter.forward
    counter.reset()
    together = evaluate(model, joint, ["aopc", "sufficiency"], preset)
    together_rows = counter.forward
    for metric in ("aopc", "sufficiency"):
        got = together[metric].per_example.values.reshape(len(TEXTS), 2)
        for j in range(2):
            np.testing.assert_allclose(got[:, j], separate[j][metric].per_example.values, atol=1e-6)
    # the originals (5 texts, not 10) and every row the two methods share ran once
    assert together_rows <= separate_rows - len(TEXTS)


def test_a_text_repeated_in_one_call_runs_once(model):
    expl = model.explain(TEXTS[:1], "grad_x_input")
    counter = model.adapter.counter
    counter.reset()
    one = evaluate(model, expl, ["aopc"], "default")["aopc"].per_example.values
    rows = counter.forward
    counter.reset()
    three = evaluate(model, expl * 3, ["aopc"], "default")["aopc"].per_example.values
    assert counter.forward == rows
    np.testing.assert_allclose(three, np.repeat(one, 3), atol=1e-6)
