"""Every registered method passes :func:`heedful.testing.check_method`, and each check catches
the defect it is for: deliberately broken methods, registered under test-only names (removed
afterwards), fail the right check."""

from __future__ import annotations

import doctest

import pytest
import torch

import heedful
import heedful.testing
import heedful.threads
from heedful import registry
from heedful.engine.seeding import example_generators
from heedful.testing import CHECKS, ConformanceError, check_method

CASES = ["bert/classification", "bert/regression", "bert/masked_lm", "llama/classification", "llama/regression", "llama/causal_lm"]
PRE_LN_ONLY = {"alti_logit"}
"""Methods that decline post-LN models (the tiny BERT) with a hint: they check on Llama only."""


@pytest.mark.parametrize("method", [m.name for m in heedful.methods()])
def test_every_method_conforms(method):
    expected = [c for c in CASES if c.startswith("llama/")] if method in PRE_LN_ONLY else CASES
    assert check_method(method) == expected


def test_the_documented_examples_run():
    for module in (heedful.testing, heedful.threads):
        outcome = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert outcome.attempted > 0 and outcome.failed == 0, module.__name__
    assert "position" not in registry.registered()


# --------------------------------------------------------------------------- broken methods


@pytest.fixture
def register_broken():
    """``register_broken(fn, family="baseline")``: ``fn`` registered under ``broken_<its name>``
    for the test, unregistered afterwards."""
    names = []

    def register(fn, family: str = "baseline"):
        name = f"broken_{fn.__name__}"
        registry.register(name, family=family, cost="-", citation="test only", summary="Deliberately broken.")(fn)
        names.append(name)
        return name

    yield register
    for name in names:
        registry.unregister(name)


def failed_checks(name: str, **kwargs) -> set[str]:
    with pytest.raises(ConformanceError) as info:
        check_method(name, families=("bert",), **kwargs)
    assert all(f.method == name and f.check in CHECKS for f in info.value.failures)
    return info.value.checks


def test_scores_normalised_over_the_batch_fail_batch_invariance(register_broken):
    def batch_normalised(problem) -> torch.Tensor:
        norms = problem.word_embeddings().norm(dim=-1)
        return norms / norms.max()  # the batch's largest, not the example's

    assert failed_checks(register_broken(batch_normalised)) == {"batch_invariance"}


def test_a_method_that_reads_the_logits_it_says_it_does_not_fails_reads_logits():
    def softmax_weighted(problem) -> torch.Tensor:
        confidence = torch.softmax(problem.reference.logits, dim=-1).amax(dim=-1)  # reads the prediction
        return problem.word_embeddings().norm(dim=-1) * confidence[:, None]

    registry.register("broken_reads_logits", family="baseline", cost="-", citation="test only", summary="Broken.", reads_logits=False)(softmax_weighted)
    try:
        assert failed_checks("broken_reads_logits") == {"reads_logits"}
    finally:
        registry.unregister("broken_reads_logits")
    assert check_method("raw_attention", families=("llama",), tasks=("causal_lm",)) == ["llama/causal_lm"]


def test_an_ignored_seed_fails_determinism(register_broken):
    def fixed_seed(problem, *, seed: int | None = 0) -> torch.Tensor:
        scores = torch.zeros(problem.batch.input_ids.shape)
        for b, gen in enumerate(example_generators(problem.batch, 0)):  # not `seed`
            scores[b] = torch.rand(problem.batch.seq_len, generator=gen)
        return scores

    assert failed_checks(register_broken(fixed_seed)) == {"determinism"}


def test_a_missing_position_fails_shape(register_broken):
    def last_dropped(problem) -> torch.Tensor:
        return problem.word_embeddings().norm(dim=-1)[:, :-1]

    # the short example's scores also lose a position alone (not in the batch): a length mismatch
    assert failed_checks(register_broken(last_dropped), tasks=("classification",)) == {"shape", "batch_invariance"}


def test_options_that_do_not_survive_json_fail_options(register_broken):
    def tuple_option(problem, *, window: tuple[int, int] = (1, 2)) -> torch.Tensor:
        return problem.word_embeddings().norm(dim=-1) * window[0]

    assert failed_checks(register_broken(tuple_option), tasks=("classification",)) == {"options"}


def test_removing_the_mask_anchor_fails_special_tokens(register_broken):
    def erase_all(problem) -> torch.Tensor:
        batch, target = problem.batch, problem.target
        erased = torch.where(batch.content_mask, problem.adapter.pad_token_id, batch.input_ids)  # [MASK] too
        fwd = problem.adapter.forward(batch, problem.anchor, input_ids=erased)
        drop = target.score(problem.reference.logits) - target.score(fwd.logits)
        return batch.content_mask * drop[:, None]

    name = register_broken(erase_all, family="perturbation")
    assert failed_checks(name, tasks=("masked_lm",)) == {"special_tokens"}


def test_passes_the_adapter_does_not_count_fail_cost(register_broken):
    def uncounted(problem) -> torch.Tensor:
        batch = problem.batch
        hidden = problem.adapter.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return hidden.last_hidden_state.norm(dim=-1)

    assert failed_checks(register_broken(uncounted), tasks=("classification",)) == {"cost"}


def test_work_the_cost_model_does_not_count_fails_cost(register_broken):
    def hidden_work(problem) -> torch.Tensor:
        batch = problem.batch
        for _ in range(3):  # counted by the adapter, but the registration predicts one forward
            problem.adapter.forward(batch, problem.anchor)
        return problem.word_embeddings().norm(dim=-1)

    assert failed_checks(register_broken(hidden_work), tasks=("classification",)) == {"cost"}


def test_a_method_is_named_by_name_function_or_info(register_broken):
    def steady(problem) -> torch.Tensor:
        return problem.word_embeddings().norm(dim=-1)

    name = register_broken(steady)
    info = heedful.get_method(name)
    expected = ["bert/classification"]
    for method in (name, steady, info):
        assert check_method(method, families=("bert",), tasks=("classification",)) == expected
    with pytest.raises(ValueError, match="not registered"):
        check_method(lambda problem: problem)
