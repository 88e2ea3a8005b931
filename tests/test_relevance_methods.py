"""Relevance methods: registered with citations, run on every task, batch-independent,
consistent with each other where the papers say they must be, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest

import heedful
from heedful.errors import HeedfulError, InputError
from heedful.lrp.masks import HeadMask, cache_path

METHODS = ("lrp", "partial_lrp", "chefer", "cam", "attention_gradcam", "attnlrp", "mask_lrp")
TEXTS = ["a charming and often affecting journey", "the movie was dull"]


def _mask(model, seed: int = 0) -> list[list[int]]:
    layers, heads = model.adapter.num_layers, model.adapter.config.num_attention_heads
    return (np.random.default_rng(seed).random((layers, heads)) < 0.5).astype(int).tolist()


def _options(model, method: str) -> dict:
    return {"head_mask": _mask(model)} if method == "mask_lrp" else {}


def test_registered_with_paper_and_docstring():
    names = {m.name for m in heedful.methods(family="relevance")}
    assert set(METHODS) <= names
    for name in METHODS:
        info = heedful.get_method(name)
        assert info.citation and info.summary and info.cost
        assert "[B, N]" in info.fn.__doc__
        # every task: an encoder–decoder (seq2seq_lm) is refused by the method's needs, in one line
        assert set(info.tasks) == set(heedful.registry.ALL_TASKS)


@pytest.mark.parametrize("family,task", [("bert", "classification"), ("bert", "regression"), ("llama", "causal_lm")])
def test_every_method_explains_every_task(tiny, family, task):
    model = tiny(family, task)
    for method in METHODS:
        found = model.explain(TEXTS, method, **_options(model, method))
        for expl in found:
            assert expl.scores.shape == (len(expl.tokens),)
            assert np.isfinite(expl.scores).all(), method
        assert np.abs(found[0].scores).sum() > 0, method


def test_masked_lm_targets(tiny):
    model = tiny("bert", "masked_lm")
    for method in ("lrp", "chefer", "attnlrp"):
        expl = model.explain("a charming and [MASK] journey", method)
        assert np.isfinite(expl.scores).all()
        if method == "lrp":
            assert expl.scores.sum() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_scores_do_not_depend_on_the_batch(tiny, family):
    model = tiny(family)
    longer = "we watched it twice and loved every minute of this intelligent , funny and moving film"
    for method in ("chefer", "attnlrp", "mask_lrp") if family == "bert" else ("lrp", "attnlrp"):
        opts = _options(model, method)
        alone = model.explain(TEXTS[1], method, **opts).scores
        batched = model.explain([longer, TEXTS[1]], method, **opts)[1].scores
        assert np.allclose(alone, batched, rtol=1e-3, atol=1e-3 * np.abs(alone).max()), method


def test_lrp_conserves_the_seed_and_contrasts_sum_to_zero(tiny):
    model = tiny("bert")
    for expl in model.explain(TEXTS, "lrp"):
        assert expl.scores.sum() == pytest.approx(1.0, abs=1e-4)
    contrast = model.explain(TEXTS[0], "lrp", target="POSITIVE vs NEGATIVE")
    assert contrast.scores.sum() == pytest.approx(0.0, abs=1e-4)
    chefer_rules = model.explain(TEXTS[0], "lrp", rules="chefer")
    assert chefer_rules.scores.sum() == pytest.approx(1.0, abs=1e-4)


def test_mask_lrp_with_every_head_kept_is_chefer(tiny):
    model = tiny("bert")
    everything = np.ones((model.adapter.num_layers, model.adapter.config.num_attention_heads), int)
    chefer = model.explain(TEXTS, "chefer")
    literal = model.explain(TEXTS, "mask_lrp", head_mask=everything)  # the default variant
    reference = model.explain(TEXTS, "mask_lrp", head_mask=everything, variant="reference", reference_scale=False)
    for a, b, c in zip(chefer, literal, reference, strict=True):
        np.testing.assert_allclose(b.scores, a.scores, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c.scores, a.scores, rtol=1e-5, atol=1e-7)
    # the reference keeps the unhalved map in masked layers: a different rollout
    unhalved = model.explain(TEXTS[0], "mask_lrp", head_mask=everything, variant="reference")
    assert not np.allclose(unhalved.scores, chefer[0].scores)
    # masking heads changes what reaches the input, in either variant, and the variants differ
    fewer = model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model)).scores
    fewer_reference = model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model), variant="reference", reference_scale=False).scores
    assert not np.allclose(fewer, chefer[0].scores) and not np.allclose(fewer_reference, chefer[0].scores)
    assert not np.allclose(fewer, fewer_reference)


@pytest.mark.parametrize("heads_mean", ["kept", "all"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_literal_mask_lrp_rollout_against_a_plain_loop_over_eq_10_11(tiny, seed, heads_mean):
    # Song et al. 2024 Eq. 10-11 written out: per layer E_h (grad A * R_A)^+ -- the mean over the
    # *kept* heads, or (heads_mean="all") over every head of the layer -- plus I, rows normalised,
    # multiplied from the first layer up; the [CLS] row with its own entry 0. R_A and grad A are the
    # recorded per-head maps of the masked pass.
    import torch

    from heedful.lrp import CheferRules, propagate

    model = tiny("bert")
    mask = _mask(model, seed)
    mask[0] = [0] * len(mask[0])  # a layer without kept heads as well
    for text in TEXTS:
        problem = model.prepare(text)
        found = propagate(
            model.adapter, problem.batch, problem.target, CheferRules(), maps=True, gradients=True, inputs=False,
            head_mask=torch.tensor(mask), mask_variant="literal",
        )
        n = problem.batch.input_ids.shape[1]
        joint = np.eye(n)
        for layer, row in enumerate(mask):
            grads, rels = found.attn_grads[layer][0].double().numpy(), found.maps[layer][0].double().numpy()
            cam = np.zeros((n, n))
            if heads_mean == "all":  # E_h over every head: a cut head's R_A is 0 in the masked pass, so it adds 0
                for h in range(len(row)):
                    cam += np.maximum(grads[h] * rels[h], 0.0) / len(row)
            else:
                kept = [h for h, keep in enumerate(row) if keep]
                for h in kept:
                    cam += np.maximum(grads[h] * rels[h], 0.0) / len(kept)
            step = cam + np.eye(n)
            step /= step.sum(axis=1, keepdims=True)
            joint = step @ joint
        expected = joint[0].copy()
        expected[0] = 0.0
        got = model.explain(text, "mask_lrp", head_mask=mask, heads_mean=heads_mean).scores
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7 * np.abs(expected).max())


def test_mask_lrp_heads_mean_readings_differ_only_where_a_block_cuts_heads(tiny):
    from heedful.attribution import get_method

    model = tiny("bert")
    layers, heads = model.adapter.num_layers, model.adapter.config.num_attention_heads
    everything = np.ones((layers, heads), int)
    kept = model.explain(TEXTS[0], "mask_lrp", head_mask=everything).scores
    np.testing.assert_allclose(model.explain(TEXTS[0], "mask_lrp", head_mask=everything, heads_mean="all").scores, kept, rtol=1e-6)
    partial = _mask(model, 1)
    assert 0 < sum(map(sum, partial)) < layers * heads
    assert not np.allclose(model.explain(TEXTS[0], "mask_lrp", head_mask=partial, heads_mean="all").scores,
                           model.explain(TEXTS[0], "mask_lrp", head_mask=partial).scores)
    # stored results of the default reading keep their keys; the other reading gets its own
    info = get_method("mask_lrp")
    assert "heads_mean" not in info.key_options(info.bind({"head_mask": partial}))
    assert info.key_options(info.bind({"head_mask": partial, "heads_mean": "all"}))["heads_mean"] == "all"


def test_mask_lrp_variant_options_are_checked(tiny):
    model = tiny("bert")
    with pytest.raises(InputError, match="variant"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model), variant="paper")
    with pytest.raises(InputError, match="reference_scale"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model), reference_scale=False)
    with pytest.raises(InputError, match="heads_mean applies to variant='literal' only"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model), variant="reference", heads_mean="all")
    with pytest.raises(InputError, match="heads_mean"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=_mask(model), heads_mean="some")


def test_mask_lrp_reads_a_saved_mask_and_the_default_cache(tiny, tmp_path, monkeypatch):
    model = tiny("bert")
    mask = HeadMask.from_array(_mask(model, seed=3), {"model": model.name, "dataset": "movies", "xi_synt": 0.1, "xi_pos": 0.8, "include_self": True})
    expected = model.explain(TEXTS[0], "mask_lrp", head_mask=mask.mask.astype(int).tolist()).scores
    saved = mask.save(tmp_path / "mask.json")
    np.testing.assert_allclose(model.explain(TEXTS[0], "mask_lrp", head_mask=str(saved)).scores, expected)
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path / "home"))
    mask.save(cache_path(model.adapter))
    np.testing.assert_allclose(model.explain(TEXTS[0], "mask_lrp").scores, expected)


def test_mask_lrp_ablations_by_name(tiny):
    from heedful.lrp.masks import HeadMask, random_mask, without_positional

    model = tiny("bert")
    synt = np.zeros((2, 4, 4), bool)
    synt[1, 2, 0] = True
    pos = np.zeros((2, 4), bool)
    pos[0, 1] = True
    mask = HeadMask(synt.any(-1) | pos, synt, pos)
    by_name = model.explain(TEXTS[0], "mask_lrp", head_mask=mask, ablation="random", ablation_seed=4).scores
    by_hand = model.explain(TEXTS[0], "mask_lrp", head_mask=random_mask(mask, 4)).scores
    np.testing.assert_allclose(by_name, by_hand)
    no_pos = model.explain(TEXTS[0], "mask_lrp", head_mask=mask, ablation="no_positional").scores
    np.testing.assert_allclose(no_pos, model.explain(TEXTS[0], "mask_lrp", head_mask=without_positional(mask)).scores)
    full = model.explain(TEXTS[0], "mask_lrp", head_mask=mask, ablation="corrupted", corruption_rate=1.0).scores
    np.testing.assert_allclose(full, model.explain(TEXTS[0], "mask_lrp", head_mask=np.ones((2, 4), int)).scores)
    with pytest.raises(InputError, match="ablation"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=mask, ablation="shuffled")


def test_costs_are_counted(tiny):
    model = tiny("bert")
    assert model.explain(TEXTS[0], "attnlrp").cost.forward_passes == 1
    assert model.explain(TEXTS[0], "attnlrp").cost.backward_passes == 1
    chefer = model.explain(TEXTS[0], "chefer").cost
    assert (chefer.forward_passes, chefer.backward_passes) == (1, 2)


def test_attention_gradcam_is_min_max_normalised(tiny):
    for expl in tiny("llama").explain(TEXTS, "attention_gradcam"):
        assert expl.scores.min() >= 0 and expl.scores.max() <= 1 + 1e-6


def test_bad_options_fail_with_a_hint(tiny):
    model = tiny("bert")
    with pytest.raises(InputError, match="head mask has shape"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=[[1, 0], [0, 1]])
    with pytest.raises(InputError, match="0/1"):
        model.explain(TEXTS[0], "mask_lrp", head_mask=np.full((2, 4), 0.5))
    with pytest.raises(InputError, match="no head-mask file"):
        model.explain(TEXTS[0], "mask_lrp", head_mask="/nonexistent/mask.json")
    with pytest.raises(InputError, match="start_layer"):
        model.explain(TEXTS[0], "chefer", start_layer=7)
    with pytest.raises(InputError, match="rules"):
        model.explain(TEXTS[0], "lrp", rules="epsilon")


def test_unmapped_family_is_refused_clearly(tiny):
    with pytest.raises(HeedfulError, match="^chefer needs a relevance \\(LRP\\) rule set") as info:
        tiny("deberta-v2").explain(TEXTS[0], "chefer")
    assert "docs/extending.md" in info.value.hint
