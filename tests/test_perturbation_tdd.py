"""TDD against a re-statement of the reference procedure, and the word-by-word noise baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import heedful
from heedful.attribution import tdd as tdd_module
from heedful.attribution._masks import features_of
from heedful.attribution.noise import HEAD, NoiseProbe, noise_scale
from heedful.engine.seeding import example_generators

PROMPT = "the capital of france is"


def _resolved(model, texts, target=None):
    problem = model.prepare(texts, target)
    return problem, problem.batch, problem.target


def _two_tokens(model) -> tuple[int, int, tuple[int, int]]:
    ids = model.tokenizer(" paris film", add_special_tokens=False)["input_ids"]
    a, b = ids[0], ids[-1]
    return a, b, (a, b)  # token ids (a string such as "281 vs 282" would name the tokens "281", "282")


@torch.no_grad()
def _reference_tdd(hf_model, ids: list[int], a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference procedure (zijian678/TDD, TDD_step1.py) re-stated: forward from one pass,
    backward from the suffixes ids[-i:], contrastive softmax over the target and foil logits."""

    def s(logits):
        pair = torch.softmax(torch.stack([logits[a], logits[b]]), dim=0)
        return float(pair[0] - pair[1])

    logits = hf_model(torch.tensor([ids])).logits[0]
    d = [s(row) for row in logits]
    forward = np.array([d[0]] + [d[t] - d[t - 1] for t in range(1, len(d))])
    back = [s(hf_model(torch.tensor([ids[-i:]])).logits[0, -1]) for i in range(1, len(ids) + 1)]
    backward = np.array([back[0]] + [back[i] - back[i - 1] for i in range(1, len(back))])[::-1]
    return forward, backward


def test_tdd_matches_the_reference_on_gpt2(tiny):
    model = tiny("gpt2", "causal_lm")
    a, b, target = _two_tokens(model)
    ids = model.tokenizer(PROMPT)["input_ids"]
    forward, backward = _reference_tdd(model.hf_model, ids, a, b)
    got = {d: model.explain(PROMPT, method="tdd", target=target, direction=d).scores for d in tdd_module.Direction.__args__}
    np.testing.assert_allclose(got["forward"], forward, atol=1e-5)
    np.testing.assert_allclose(got["backward"], backward, atol=1e-5)
    np.testing.assert_allclose(got["bidirectional"], (forward + backward) / 2, atol=1e-5)


@pytest.mark.parametrize("family,task", [("llama", "classification"), ("gpt2", "causal_lm"), ("opt", "causal_lm")])
def test_one_pass_prefixes_equal_deleted_suffixes(tiny, family, task):
    model = tiny(family, task)
    problem, batch, target = _resolved(model, [PROMPT, "we watched it twice and loved every minute"])
    features = features_of(batch, target)
    fast = tdd_module._prefix_one_pass(problem, features)
    assert fast is not None
    steps = torch.arange(features.width + 1)[:, None]
    keep = (torch.arange(features.width)[None, :] < steps)[None].expand(len(batch), -1, -1)
    slow = tdd_module._row_scores(problem, features, keep, None)
    for b in range(len(batch)):
        m = int(features.counts[b])
        torch.testing.assert_close(fast[b, : m + 1], slow[b, : m + 1], atol=1e-5, rtol=1e-4)


def test_tdd_telescopes_to_the_output_change_on_an_encoder(tiny):
    model = tiny("bert")
    text = "a charming and often affecting journey"
    e = model.explain(text, method="tdd", target="POSITIVE vs NEGATIVE", direction="forward")
    adapter = model.adapter
    full = model.hf_model(**model.tokenizer([text], return_tensors="pt")).logits[0].detach()
    empty = model.hf_model(**model.tokenizer([""], return_tensors="pt")).logits[0].detach()

    def s(lg):
        return float(torch.tanh((lg[2] - lg[0]) / 2))

    assert e.scores.sum() == pytest.approx(s(full) - s(empty), abs=1e-5)
    assert e.scores[0] == 0 and e.scores[-1] == 0
    del adapter
    back = model.explain(text, method="tdd", target="POSITIVE vs NEGATIVE", direction="backward")
    assert back.scores.sum() == pytest.approx(s(full) - s(empty), abs=1e-5)
    # non-contrastive (ours): the target's probability under the full softmax
    plain = model.explain(text, method="tdd", target="POSITIVE", direction="forward")
    p = lambda lg: float(torch.softmax(lg, dim=0)[2])  # noqa: E731
    assert plain.scores.sum() == pytest.approx(p(full) - p(empty), abs=1e-5)


def test_tdd_options_and_batch_invariance(tiny):
    model = tiny("gpt2", "causal_lm")
    texts = [PROMPT, "the movie was dull"]
    together = model.explain(texts, method="tdd")
    alone = model.explain(texts[1], method="tdd")
    np.testing.assert_allclose(together[1].scores, alone.scores, atol=1e-6)
    with pytest.raises(heedful.InputError):
        model.explain(PROMPT, method="tdd", direction="sideways")


def test_individual_perturbation_noises_one_token_at_a_time(tiny):
    model = tiny("bert")
    problem, batch, target = _resolved(model, ["a charming and often affecting journey"])
    adapter = model.adapter
    from heedful.attribution.individual_perturbation import individual_perturbation

    scores = individual_perturbation(problem, samples=1, seed=0)
    probe = NoiseProbe.build(problem, (HEAD,))
    std = noise_scale(adapter, probe, torch.tensor([0]))
    n = int(batch.lengths[0])
    draws = torch.randn((n, 1, probe.dim), generator=example_generators(batch, 0)[0])
    noise = torch.zeros(n, batch.seq_len, probe.dim)
    noise[torch.arange(n), torch.arange(n)] = draws[:, 0] * std
    expected = probe.distortion(torch.zeros(n, dtype=torch.long), torch.full((n,), HEAD), noise)
    torch.testing.assert_close(scores[0, :n], expected, atol=1e-6, rtol=1e-5)


def test_individual_perturbation_seeded_batch_invariant_and_layered(tiny):
    model = tiny("gpt2")
    texts = ["a charming and often affecting journey", "the movie was dull"]
    together = model.explain(texts, method="individual_perturbation", seed=0)
    alone = model.explain(texts[1], method="individual_perturbation", seed=0)
    np.testing.assert_allclose(together[1].scores, alone.scores, rtol=1e-4, atol=1e-6)
    layered = model.explain(texts[1], method="individual_perturbation", seed=0, layer=1, sigma=0.5)
    assert np.isfinite(layered.scores).all() and (layered.scores > 0).all()
    with pytest.raises(heedful.InputError):
        model.explain(texts[1], method="individual_perturbation", sigma=-1.0)
