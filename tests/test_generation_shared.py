"""The shared-prefix path of generation attribution (:mod:`heedful.generation_shared`): equal to
the per-step path (every step row its own forward and backward, the path the plain-loop oracle
of tests/test_generation.py checks) with one forward per sequence -- per interpolation point for
integrated gradients -- instead of one per step."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import heedful
from heedful.adapters import kernel as kernel_module
from heedful.engine.memory import Need, estimate
from heedful.generation import prepare_steps
from heedful.generation_shared import CancellationWarning, SharedSteps, _groups, explain_shared

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


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_attnlrp_shared_path_equals_each_steps_own_relevance_pass_with_one_forward_per_sequence(tiny, family):
    """AttnLRP's rules are local to each operation and a causal model's states before a position
    do not depend on later tokens: one forward under the rules per sequence, and per step a
    backward of the modified gradient, give every step row's own relevance pass."""
    lm = tiny(family, "causal_lm")
    generation, plain, (plain_fwd, plain_bwd), scores, (fwd, bwd) = _both(lm, "attnlrp", {}, quantity="logit")
    rows = sum(generation.steps)
    assert scores.shape == plain.shape
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * float(plain.abs().max()), rtol=1e-4)
    assert (plain_fwd, fwd) == (rows, len(PROMPTS))
    assert plain_bwd == bwd == rows


def _noise_runs(lm, generation, noise_level: float) -> int:
    """Runs of steps sharing one SmoothGrad noise scale, counted by a plain loop: per sequence,
    ``noise_level * (max - min)`` of each step's prefix embeddings, one run per change."""
    runs = 0
    embedding = lm.adapter.word_embeddings
    for b, (prompt, steps) in enumerate(zip(generation.prompt_lengths, generation.steps, strict=True)):
        ids = generation.batch.input_ids[b]
        last = None
        for t in range(steps):
            e = embedding(ids[: prompt + t]).detach()
            sigma = noise_level * (e.max() - e.min())
            runs += last is None or bool(sigma != last)
            last = sigma
    return runs


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"nt_type": "vargrad"},
        {"nt_type": "smoothgrad_sq", "inner": "grad_x_input"},
        {"multiply_by_inputs": True, "noise_level": 0.3},
        {"inner": "integrated_gradients"},
        {"internal_batch_size": 1},  # one noised run a pass
    ],
)
def test_smoothgrad_shared_path_draws_the_per_step_noise_with_one_noised_forward_per_run(tiny, family, options):
    """A position's SmoothGrad draw depends only on the tokens up to it, so the whole sequence's
    noised pass carries every step's own noise; the steps of one noise scale share it."""
    lm = tiny(family, "causal_lm")
    samples = 3
    options = {"n_samples": samples, "seed": 4, **options}
    generation, plain, (plain_fwd, plain_bwd), scores, (fwd, bwd) = _both(lm, "smoothgrad", options)
    scale = float(plain.abs().max())
    assert scale > 0
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * scale, rtol=1e-4)
    inner = heedful.get_method(options.get("inner", "saliency"))
    rows, points = sum(generation.steps), inner.defaults.get("n_steps", 1)  # the wrapped method runs at its defaults
    runs = _noise_runs(lm, generation, options.get("noise_level", 0.15))
    assert len(PROMPTS) <= runs < rows
    # both: the rows' clean reference, one pass per sequence; then per sample and point one pass
    # per step row, against one per run
    assert (plain_fwd, fwd) == (len(PROMPTS) + samples * points * rows, len(PROMPTS) + samples * points * runs)
    assert plain_bwd == bwd == samples * points * rows


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_whole_pass_steps_per_backward_changes_nothing_but_the_grouping(tiny, family, steps, monkeypatch):
    lm = tiny(family, "causal_lm")
    monkeypatch.setattr(SharedSteps, "segment", None)  # one pass over the whole sequences (encoder–decoders' path)
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


BF16_DIFFERENCE = 0.15
"""Largest score difference of the bf16 passes from float32, relative to the prompt's largest
float32 score: a gradient is a sum of products each rounded to bfloat16's eps (2**-8) times a
few dozen -- the bound tests/test_half_precision.py holds a bfloat16-stored model to. (Relative
to a step's own largest score, a signed sum over the embedding that cancels to near 0 can
exceed it.)"""


@pytest.mark.parametrize("method,options", [("saliency", {}), ("grad_x_input", {}), ("integrated_gradients", {"n_steps": 4, "baseline": "pad"})])
def test_bf16_generation_is_float32_within_the_bf16_bound(tiny, method, options):
    lm = tiny("llama", "causal_lm")
    expected = lm.explain_generation(PROMPTS, method, continuation=CONTINUATIONS, **options)
    found = lm.explain_generation(PROMPTS, method, continuation=CONTINUATIONS, precision="bf16", **options)
    assert all(g.options["precision"] == "bf16" for g in found)
    for e, f in zip(expected, found, strict=True):
        assert np.array_equal(np.isnan(e.scores), np.isnan(f.scores))
        worst, largest = np.nanmax(np.abs(f.scores - e.scores)), np.nanmax(np.abs(e.scores))
        assert 0 < worst <= BF16_DIFFERENCE * largest, (method, worst / largest)  # > 0: the passes ran in bfloat16
        np.testing.assert_allclose(f.probabilities, e.probabilities, atol=0.05)
    # the bf16 copy's passes: one forward per sequence, a backward per step, as at float32
    assert found[0].cost.backward_passes == pytest.approx(options.get("n_steps", 1))


def test_bf16_generation_runs_attention_in_float32_where_its_backward_follows(tiny, monkeypatch):
    """heedful.adapters.kernel: the bf16 copy's matrix products stay bfloat16, the fused attention
    kernel of its gradient passes gets float32 (its bfloat16 backward is several times slower on CPUs)."""
    lm = tiny("llama", "causal_lm")
    seen, kernel = [], kernel_module._fused

    def spy(q, k, v, **options):
        seen.append((q.dtype, torch.is_grad_enabled() and q.requires_grad))
        return kernel(q, k, v, **options)

    monkeypatch.setattr(kernel_module, "_fused", spy)
    lm.explain_generation(PROMPTS, "saliency", continuation=CONTINUATIONS, precision="bf16")
    graded = [dtype for dtype, grad in seen if grad]
    assert graded and set(graded) == {torch.float32}


def test_bf16_integrated_gradients_warns_that_its_sums_cancel(tiny):
    lm = tiny("llama", "causal_lm")
    with pytest.warns(CancellationWarning, match="integrated_gradients through bfloat16 passes"):
        lm.explain_generation("the cat", "integrated_gradients", continuation=" sat", precision="bf16", n_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CancellationWarning)
        lm.explain_generation("the cat", "saliency", continuation=" sat", precision="bf16")
        lm.explain_generation("the cat", "integrated_gradients", continuation=" sat", n_steps=2)


def test_generation_precision_refusals(tiny):
    lm = tiny("llama", "causal_lm")
    with pytest.raises(heedful.InputError, match="has no int8 path"):
        lm.explain_generation("the cat", "saliency", continuation=" sat", precision="int8")
    with pytest.raises(heedful.InputError, match="smoothgrad has no bf16 path"):
        lm.explain_generation("the cat", "smoothgrad", continuation=" sat", precision="bf16")
    with pytest.raises(heedful.InputError, match="precision 'fp8'"):
        lm.explain_generation("the cat", "saliency", continuation=" sat", precision="fp8")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("segment", [1, 3])
@pytest.mark.parametrize(
    "method,options", [("grad_x_input", {}), ("integrated_gradients", {"n_steps": 3, "baseline": "pad"}), ("attnlrp", {})]
)
def test_swept_pass_restricts_each_backward_to_its_prefix_and_changes_no_score(tiny, family, segment, method, options, monkeypatch):
    """Segment after segment, each continuing the keys and values before it as leaves, and one
    reverse sweep: a step's backward -- AttnLRP's modified one too, each rule being local to its
    operation -- through its own prefix only, equal to the per-step rows."""
    lm = tiny(family, "causal_lm")
    monkeypatch.setattr(SharedSteps, "segment", segment)

    def whole(*args):
        raise AssertionError("a decoder's shared passes fell back to one backward through the whole pass")

    monkeypatch.setattr(SharedSteps, "_whole", whole)
    quantity = "logit" if method == "attnlrp" else "log_prob"
    generation, plain, (_, plain_bwd), scores, (fwd, bwd) = _both(lm, method, options, quantity=quantity)
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * float(plain.abs().max()), rtol=1e-4)
    assert bwd == plain_bwd


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method,options", [("saliency", {}), ("integrated_gradients", {"n_steps": 3, "baseline": "pad"})])
def test_a_logit_score_reads_only_its_target_columns_of_the_head_and_changes_no_score(tiny, family, method, options, monkeypatch):
    """A pass whose logits nobody reads -- integrated gradients' path points, every pass of a
    generation that kept its probabilities -- explaining a logit reads the head at the target's
    columns alone: no full-vocabulary head runs, and every score equals the per-step rows'."""
    lm = tiny(family, "causal_lm")
    generation = lm.generate(PROMPTS, 3)
    assert generation.log_probs is not None
    info = lm.method(method)
    bound = info.bind(options, lm.adapter.device)
    problem, _, _ = prepare_steps(lm.adapter, generation, info, "logit")
    plain = info.fn(problem, **bound).detach()
    full_heads = []
    read = type(lm.adapter).head_logits

    def counted(self, h, columns=None):
        full_heads.append(columns is None)
        return read(self, h, columns)

    monkeypatch.setattr(type(lm.adapter), "head_logits", counted)
    found = explain_shared(lm.adapter, generation, info, bound, "logit")
    assert found is not None
    scores = found[3]
    np.testing.assert_allclose(scores.numpy(), plain.numpy(), atol=1e-5 * float(plain.abs().max()), rtol=1e-4)
    assert full_heads and not any(full_heads)  # the head read in every segment, at the target's columns only
    full_heads.clear()
    explain_shared(lm.adapter, generation, info, bound, "log_prob")  # a log-probability needs every column
    assert full_heads and all(full_heads)


def test_segment_bounds_start_at_the_first_anchor():
    from heedful.generation_shared import segment_bounds

    assert segment_bounds(torch.tensor([4, 5, 9, 6]), 2) == [0, 5, 7, 9, 10]
    assert segment_bounds(torch.tensor([3]), 4) == [0, 4]


def test_raw_attention_over_steps_copies_only_the_layer_it_reads(tiny):
    from heedful.generation import StepAttentions

    lm = tiny("llama", "causal_lm")
    generation = lm.generate(PROMPTS, continuation=CONTINUATIONS)
    info = lm.method("raw_attention")
    problem, example, step = prepare_steps(lm.adapter, generation, info)
    scores = info.fn(problem)
    attentions = problem.reference.attentions
    assert isinstance(attentions, StepAttentions) and list(attentions._rows) == [len(attentions) - 1]
    # every layer read gives the rows' own masked probabilities, whichever way it is read
    assert torch.equal(attentions[-1], attentions[len(attentions) - 1]) and len(attentions[0:2]) == 2
    assert scores.shape == (len(example), problem.batch.seq_len)


@pytest.mark.parametrize("method,options", [("integrated_gradients", {"n_steps": 3}), ("smoothgrad", {"n_samples": 2})])
def test_a_generation_that_kept_its_probabilities_runs_no_reference_pass_for_them(tiny, method, options):
    lm = tiny("llama", "causal_lm")
    kept = lm.generate(PROMPTS, 3)
    given = dataclasses.replace(kept, log_probs=None, forced=True)
    counter = lm.adapter.counter
    passes = {}
    for name, generation in (("kept", kept), ("given", given)):
        counter.reset()
        passes[name] = (explain_shared(lm.adapter, generation, lm.method(method), lm.method(method).bind(options), "logit"), counter.forward)
    (_, _, _, with_kept), forward_kept = passes["kept"]
    (_, _, _, with_head), forward_given = passes["given"]
    torch.testing.assert_close(with_kept, with_head, rtol=0, atol=1e-5 * float(with_head.abs().max()))
    assert forward_given - forward_kept == len(PROMPTS)  # the one pass per sequence that read the steps' logits


def test_a_pass_continuing_every_example_in_order_takes_the_states_themselves_not_a_gather(tiny):
    """The swept segments continue all their sequences' keys and values: the cache is made of
    those tensors (a gather's backward, vmapped over the steps' cotangents, runs once per
    cotangent); a subset or another order of the examples is still gathered."""
    from heedful.adapters import PrefixStates

    lm = tiny("llama", "causal_lm")
    torch.manual_seed(0)
    keys = tuple(torch.randn(3, 2, 5, 4, requires_grad=True) for _ in range(2))
    values = tuple(torch.randn(3, 2, 5, 4, requires_grad=True) for _ in range(2))
    states = PrefixStates(keys, values)

    def gathered(tensor: torch.Tensor) -> bool:
        seen, todo = set(), [tensor.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if "Index" in type(node).__name__:
                return True
            todo.extend(next_node for next_node, _ in node.next_functions)
        return False

    for length in (5, 2):
        cache = lm.adapter._prefix_cache((states, torch.arange(3), length))
        assert torch.equal(cache.layers[0].keys, keys[0][:, :, :length]) and torch.equal(cache.layers[1].values, values[1][:, :, :length])
        assert not gathered(cache.layers[0].keys) and not gathered(cache.layers[1].values)
    picked = lm.adapter._prefix_cache((states, torch.tensor([2, 0]), 4))
    assert torch.equal(picked.layers[1].values, values[1][[2, 0], :, :4])
    assert gathered(picked.layers[1].values)
