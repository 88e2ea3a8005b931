"""The shared-prefix path of generation attribution (:mod:`heedful.generation_shared`): equal to
the per-step path (every step row its own forward and backward, the path the plain-loop oracle
of tests/test_generation.py checks) with one forward per sequence -- per interpolation point for
integrated gradients -- instead of one per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heedful.engine.memory import Need, estimate
from heedful.generation import prepare_steps
from heedful.generation_shared import SharedSteps, _groups, explain_shared

PROMPTS = ["the cat sat on the mat and", "a dog ran", "birds"]
CONTINUATIONS = [" the dog sat", " far away from the cat and the", " sing"]


def _both(lm, method: str, options: dict, quantity: str = "log_prob"):
    """(per-step scores [R, W], forward and backward sequences; shared scores, forwards, backwards)."""
    generation = lm.generate(PROMPTS, continuation=CONTINUATIONS)
    info = lm.method(method)
    bound = info.bind(options, lm.adapter.device)
    counter = lm.adapter.counter
    counter.reset()
    problem, _, _ = prepare_steps(lm.adapter, generation, info, quantity)
    plain = info.fn(problem, **bound).detach()
    plain_passes = (counter.forward, counter.backward)
    counter.reset()
    found = explain_shared(lm.adapter, generation, info, bound, quantity)
    assert found is not None
    shared_problem, example, step, scores = found
    assert torch.equal(shared_problem.target.classes, problem.target.classes)
    np.testing.assert_allclose(shared_problem.reference.logits.detach().float().numpy(), problem.reference.logits.detach().float().numpy(), atol=1e-5, rtol=1e-4)
    return generation, plain, plain_passes, scores, (counter.forward, counter.backward)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize(
    "method,options",
    [("saliency", {}), ("grad_x_input", {}), ("grad_x_input", {"aggregate": "l1"}), ("integrated_gradients", {"n_steps": 5, "baseline": "pad"})],
)
def test_shared_path_equals_the_per_step_path_with_one_forward_per_sequence(tiny, family, method, options):
    lm = tiny(family, "causal_lm")
    generation, plain, (plain_fwd, plain_bwd), scores, (fwd, bwd) = _both(lm, method, options)
    rows = sum(generation.steps)
    assert scores.shape == plain.shape == (rows, max(p + t for p, t in zip(generation.prompt_lengths, generation.steps, strict=True)) - 1)
    scale = float(plain.abs().max())
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * scale, rtol=1e-4)
    sequences = len(PROMPTS)
    points = options.get("n_steps", 1)
    if method == "integrated_gradients":  # the rows' shared reference pass, then one per point: per sequence, not per step
        assert (plain_fwd, fwd) == (sequences + points * rows, sequences + points * sequences)
    else:
        assert (plain_fwd, fwd) == (rows, sequences)
    assert plain_bwd == bwd == points * rows  # one backward per step row and point, as before


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_per_backward_changes_nothing_but_the_grouping(tiny, steps, monkeypatch):
    lm = tiny("llama", "causal_lm")
    monkeypatch.setattr(SharedSteps, "steps_per_backward", steps)
    _, plain, (_, plain_bwd), scores, (fwd, bwd) = _both(lm, "grad_x_input", {})
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * float(plain.abs().max()), rtol=1e-4)
    assert (fwd, bwd) == (len(PROMPTS), plain_bwd)


def test_shared_path_groups_sequences_under_the_memory_budget(tiny):
    lm = tiny("llama", "causal_lm")
    adapter = lm.adapter
    budget = adapter.max_memory
    generation = lm.generate(PROMPTS, continuation=CONTINUATIONS)
    lengths, steps = generation.batch.lengths, max(generation.steps)
    need = Need(grad="saved", anchors=steps)
    try:  # room for one sequence's kept graph a pass, not two
        adapter.max_memory = (estimate(adapter.shape, 1, int(lengths.max()), need) + estimate(adapter.shape, 2, int(lengths.max()), need)) // 2
        assert len(_groups(adapter, lengths, steps, None)) == len(PROMPTS)
        _, plain, _, scores, (fwd, _) = _both(lm, "saliency", {})
    finally:
        adapter.max_memory = budget
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * float(plain.abs().max()), rtol=1e-4)
    assert fwd == len(PROMPTS)


def test_explain_generation_takes_the_shared_path(tiny):
    lm = tiny("gpt2", "causal_lm")
    found = lm.explain_generation(PROMPTS, "saliency", continuation=CONTINUATIONS)
    steps = sum(g.steps for g in found)
    # cost per step row: one forward per sequence, shared by its steps
    assert found[0].cost.forward_passes == pytest.approx(len(PROMPTS) / steps)
    assert found[0].cost.backward_passes == pytest.approx(1.0)
