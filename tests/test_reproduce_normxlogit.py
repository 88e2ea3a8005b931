"""The NormXLogit reproduction report: ordering comparison, the batched layer-wise alignment
scores, the heatmap, and (slow) a quick end-to-end run on the zoo models."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import cached_model

from heedful.engine.targets import Target
from heedful.evaluate.evaluation import ModelInput
from heedful.reproduce import REPORTS, ReportSettings, report_writer
from heedful.reproduce import normxlogit as nx


def test_registered():
    assert "normxlogit" in REPORTS
    assert report_writer("normxlogit") is nx.write


def test_ordering_and_pair_agreement():
    ours = {"a": 0.5, "b": 0.3, "c": 0.1}
    assert nx.ordering(ours, higher_is_better=True) == ["a", "b", "c"]
    assert nx.ordering(ours, higher_is_better=False) == ["c", "b", "a"]
    share, pairs, tau = nx.pair_agreement(ours, {"a": 9.0, "b": 5.0, "c": 1.0})
    assert (share, pairs) == (1.0, 3) and tau == pytest.approx(1.0)
    share, pairs, _ = nx.pair_agreement(ours, {"a": 1.0, "b": 5.0, "c": 9.0})
    assert share == 0.0 and pairs == 3
    share, pairs, _ = nx.pair_agreement(ours, {"a": 2.0, "b": 3.0, "c": 1.0})  # a<b flipped only
    assert share == pytest.approx(2 / 3)
    assert nx.verdict(1.0) == "agrees" and nx.verdict(0.8) == "largely agrees"
    assert nx.verdict(0.5) == "partly agrees" and nx.verdict(0.2) == "disagrees"
    assert nx.verdict(float("nan")) == "cannot be compared"


def test_paper_tables_cover_every_method():
    for table in (nx.PAPER_SST2_AOPC, nx.PAPER_SST2_ACCURACY, nx.PAPER_STSB_PEARSON):
        assert set(table) == set(nx.METHODS)
    bert = {m: v[nx.BERT] for m, v in nx.PAPER_SST2_AOPC.items() if v[nx.BERT] is not None}
    # the paper's Table 1: DecompX first on BERT SST-2 AOPC, NormXLogit first among the architecture-agnostic methods
    assert max(bert, key=bert.get) == "decompx"
    assert max((m for m in bert if m != "decompx"), key=bert.get) == "normxlogit"
    assert nx.PAPER_SST2_AOPC["decompx"][nx.LLAMA] is None  # "N/A" in the paper
    # the paper's STS-B Pearson (lower is better) puts NormXLogit ahead of DecompX, its SST-2 AOPC DecompX
    assert nx.leader(nx.PAPER_STSB_PEARSON["decompx"][nx.BERT], nx.PAPER_STSB_PEARSON["normxlogit"][nx.BERT], False) == "NormXLogit"
    assert nx.leader(nx.PAPER_SST2_AOPC["decompx"][nx.BERT], nx.PAPER_SST2_AOPC["normxlogit"][nx.BERT], True) == "DecompX"


def test_alignment_scores_match_single_explanations():
    """One batched forward with per-example targets gives what explaining each text alone gives."""
    model = cached_model("llama", "causal_lm")
    texts = ["the cat sat on the", "a dog and the", "the birds"]
    spans = [((0, 4, 7),), ((0, 2, 5),), ((0, 4, 9),)]
    targets, foils = [11, 40, 77], [12, 41, 78]
    items = [
        (ModelInput(f"x{i}", t, None, Target("given", targets[i]), spans[i], targets[i], math.nan), foils[i], "p")
        for i, t in enumerate(texts)
    ]
    scores, evidence, lens, anchors = nx.alignment_scores(model, items, batch_size=2)
    layers = model.adapter.num_layers
    for i, text in enumerate(texts):
        n = len(evidence[i])
        assert evidence[i].any()
        assert anchors[i] == n - 1  # a causal LM predicts the target from the last prefix token
        for key, word in (("logat_target", targets[i]), ("logat_foil", foils[i])):
            alone = model.explain(text, "logat", Target("given", word), layerwise=True).scores
            assert scores[key][i].shape == (layers, n)
            np.testing.assert_allclose(scores[key][i], alone, rtol=1e-4, atol=1e-5)
        alone = model.explain(text, "normxlogit", Target("given", targets[i]), layerwise=True).scores
        np.testing.assert_allclose(scores["normxlogit"][i], alone, rtol=1e-4, atol=1e-5)
        for name in ("globenc", "alti", "value_zeroing"):  # the paper's per-layer baselines, batched
            alone = model.explain(text, name, layerwise=True, rollout=False).scores
            assert scores[name][i].shape == (layers, n)
            np.testing.assert_allclose(scores[name][i], alone, rtol=1e-4, atol=1e-6)
        assert scores["embedding_norm"][i].shape == (n,)
        assert scores["random"][i].shape == (nx.RANDOM_SEEDS_EXP2, n)


def test_alignment_plot_and_section(tmp_path):
    layers, rows, pairs = 4, len(nx.EXP2_METHODS), 6
    rng = np.random.default_rng(0)
    dot, ap = rng.random((rows, layers)), rng.random((rows, layers))
    t, r = nx.EXP2_METHODS.index("logat_target"), nx.EXP2_METHODS.index("random")
    dot[t], dot[r] = [0.1, 0.5, 0.6, 0.7], 0.4  # LogAt(target) below random at layer 1 only
    paradigms = {"sv_agreement": {"dot": dot, "ap": ap, "n": np.array(3)}}
    per_pair = {k: [rng.random(layers) for _ in range(pairs)] for k in nx.LENS_ROWS}
    evidence = [np.array([i % 2 == 0, True, False]) for i in range(pairs)]
    lens = nx.lens_summary(per_pair, evidence)
    assert lens["evidence_first"] == pytest.approx(0.5)
    np.testing.assert_allclose(lens["kl"], np.mean(per_pair["kl"], axis=0))
    np.testing.assert_allclose(lens["first_norm"], np.median(per_pair["first_norm"], axis=0))
    assert np.all(lens["correct_low"] <= lens["correct"]) and np.all(lens["correct"] <= lens["correct_high"])
    al = nx.Alignment(3, layers, dot, ap, dot * 0, ap * 0, paradigms, {"foil word is not one known token": 1}, 1.0, "lm@x",
                      dot - 0.05, dot + 0.05, ap - 0.05, ap + 0.05, lens)
    plot = nx.plot_alignment(al, tmp_path / "a.png")
    assert plot.stat().st_size > 0
    text = "\n".join(nx.alignment_section(al, plot))
    assert "a.png" in text and "Average precision" in text and "not BLiMP" in text
    assert nx.below_random(al) == [0]
    lens_text = "\n".join(nx.lens_section(al, nx.plot_lens(al, tmp_path / "l.png")))
    assert "l.png" in lens_text and "below random's (intervals separated) at layers 1." in lens_text
    nx._save_alignment(al, tmp_path / "al.json")
    back = nx._load_alignment(tmp_path / "al.json")
    np.testing.assert_allclose(back.ap, ap)
    np.testing.assert_allclose(back.dot_low, dot - 0.05)
    np.testing.assert_allclose(back.lens["kl"], lens["kl"])
    assert back.skipped == al.skipped and int(back.paradigms["sv_agreement"]["n"]) == 3
    assert nx._load_alignment(tmp_path / "missing.json") is None


def test_lens_quality_is_the_logit_lens_at_the_anchor():
    """Target vs foil, KL(final || layer) and the target's rank, from the final norm and the LM
    head applied to each layer's state at the anchor with the model's own modules, one by one."""
    import torch

    model = cached_model("llama", "causal_lm")
    hf = model.hf_model
    texts, targets, foils = ["the cat sat on the", "a dog and"], [11, 40], [12, 41]
    enc = [model.tokenizer(t, return_tensors="pt") for t in texts]
    with torch.no_grad():
        states = [hf(**e, output_hidden_states=True).hidden_states for e in enc]
    width = max(len(e["input_ids"][0]) for e in enc)
    pad = [torch.nn.functional.pad(torch.stack([h[0] for h in s]), (0, 0, 0, width - s[0].shape[1])) for s in states]
    hidden = tuple(torch.stack([p[layer] for p in pad]) for layer in range(len(states[0])))
    anchor = torch.tensor([len(e["input_ids"][0]) - 1 for e in enc])
    with torch.no_grad():
        got = nx.lens_quality(model.adapter, hidden, anchor, torch.tensor(targets), torch.tensor(foils))
        layers = len(hidden) - 1
        for b in range(len(texts)):
            final = torch.log_softmax(hf.lm_head(hidden[layers][b, anchor[b]]), -1)
            for k in range(layers):
                h = hidden[k + 1][b, anchor[b]]
                logp = torch.log_softmax(hf.lm_head(h if k + 1 == layers else hf.model.norm(h)), -1)
                assert got["correct"][b, k] == float(logp[targets[b]] > logp[foils[b]])
                kl = float((final.exp() * (final - logp)).sum())
                assert got["kl"][b, k] == pytest.approx(kl, abs=1e-4)
                rank = int((logp > logp[targets[b]]).sum())
                assert got["log_rank"][b, k] == pytest.approx(np.log10(1 + rank))
    assert got["kl"][:, -1] == pytest.approx([0.0, 0.0], abs=1e-6)


def test_adjacent_intervals_and_claim_verdicts():
    from heedful.evaluate.metrics import Summary
    from heedful.reproduce.toolkit import (
        DOES_NOT_HOLD,
        HOLDS,
        NOT_SEPARATED,
        WRONG_DIRECTION,
        Verdict,
    )

    intervals = {"a": (0.5, 0.7), "b": (0.45, 0.6), "c": (0.1, 0.3)}
    order = ["a", "b", "c"]
    assert nx.adjacent_overlaps(order, intervals) == ["a / b"]
    assert nx.ordering_chain(order, intervals) == "a ≈ b > c"
    assert nx.ordering_chain(["a", "d"], {**intervals, "d": (float("nan"), float("nan"))}) == "a >? d"
    hi, mid, lo = Summary(0.6, 0, 9, None, 0.55, 0.65), Summary(0.5, 0, 9, None, 0.45, 0.58), Summary(0.2, 0, 9, None, 0.1, 0.3)
    assert nx._cmp_verdict(hi, lo, True) == Verdict(HOLDS)
    assert nx._cmp_verdict(hi, mid, True) == Verdict(NOT_SEPARATED)
    assert nx._cmp_verdict(mid, hi, True) == Verdict(NOT_SEPARATED, WRONG_DIRECTION)
    assert nx._cmp_verdict(lo, hi, True) == Verdict(DOES_NOT_HOLD)
    assert nx._cmp_verdict(lo, hi, False) == Verdict(HOLDS)  # lower is better
    assert nx._layers_verdict(24, 30, 30) == Verdict(HOLDS) and nx._layers_verdict(3, 25, 30) == Verdict(NOT_SEPARATED)
    assert nx._layers_verdict(3, 5, 30) == Verdict(DOES_NOT_HOLD)


@pytest.mark.slow
def test_quick_report(tmp_path):
    from heedful import zoo

    for name in ("minilm-sentiment", "minilm-sentiment-regression", nx.LM):
        if not zoo.is_built(name):
            pytest.skip(f"zoo model {name} is not built")
    settings = ReportSettings(
        n=3, quick=True, store=tmp_path / "store", progress=False,
        options={"ig_steps": 2, "ig_steps_decoder": 2, "n_agreement": 6, "random_seeds": 2},
    )
    path = nx.write(tmp_path / "out", settings)
    text = path.read_text()
    assert path.name == "normxlogit-quick.md"
    assert "Quick smoke run" in text and "## Experiment 1" in text and "## Experiment 2" in text
    assert "paper (BERT, SST-2)" in text and "Ordering by aopc" in text
    assert "| DecompX | " in text and "| Value Zeroing (rollout) | " in text  # Experiment 1's vector-based rows
    assert "GlobEnc¬" in text and "ALTI¬" in text and "Value Zeroing¬" in text and "LogAt(plural)" in text
    assert "## Cost: the paper's Tables 4-5" in text and "**Peak memory per example (MB)**" in text
    assert "| Exp. 1, MNLI and QNLI columns | not reproduced |" in text
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert "normxlogit-quick-alignment.png" in pngs
    assert "normxlogit-quick-minilm-sentiment-aopc.png" in pngs
    decoder_ready = nx.DECODER_CLASSIFIER in zoo.ENTRIES and zoo.is_built(nx.DECODER_CLASSIFIER)
    assert f"### {nx.DECODER_CLASSIFIER} (decoder)" in text
    assert ("**Not run**" in text) != decoder_ready  # a missing decoder is said, not silently dropped


def test_depth_claim_reads_the_paired_change_over_the_pairs():
    """'With depth the target's alignment rises and the foil's drops': the same pairs at both
    layers, so the verdict comes from the paired interval of last − first layer, not from two
    marginal intervals (which here are apart and would read holds)."""
    from heedful.reproduce.normxlogit.claims import _claims_exp2
    from heedful.reproduce.toolkit import HOLDS, NOT_SEPARATED

    layers, rows = 6, len(nx.EXP2_METHODS)
    ap = np.full((rows, layers), 0.5)
    t, f = nx.EXP2_METHODS.index("logat_target"), nx.EXP2_METHODS.index("logat_foil")
    ap[t] = np.linspace(0.3, 0.9, layers)
    ap[f] = np.linspace(0.6, 0.4, layers)
    change = np.zeros((rows, 3))
    change[t] = (0.6, 0.5, 0.7)  # rises, apart from 0
    change[f] = (-0.2, -0.45, 0.05)  # the drop's paired interval contains 0

    def claim(ap_change):
        al = nx.Alignment(40, layers, ap, ap, ap * 0, ap * 0, {}, {}, 1.0, "lm@x", ap - 0.01, ap + 0.01, ap - 0.01,
                          ap + 0.01, None, ap_change)
        return {c: (number, verdict) for c, _, number, verdict in _claims_exp2(al)}[
            "With depth the target's alignment rises and the foil's drops (§5.2)"]

    number, verdict = claim(change)
    assert verdict.word == NOT_SEPARATED and "paired over the pairs" in number and "-0.200 [-0.450, +0.050]" in number
    change[f] = (-0.2, -0.3, -0.1)
    assert claim(change)[1].word == HOLDS
    assert claim(None)[1].word == HOLDS  # a cache without the paired change: the marginal intervals


def _constructed_pairs(pairs: int, layers: int):
    """Agreement-like pairs of 6 positions whose evidence is position 1 and the anchor (5): a
    self-dominant scorer (GlobEnc¬, ALTI¬, Value Zeroing¬ here) puts its largest score on the
    anchor and ranks position 1 third; NormXLogit ranks position 1 first and the anchor last."""
    rng = np.random.default_rng(0)
    self_dominant = np.array([0.3, 0.2, 0.1, 0.05, 0.01, 5.0])
    normxlogit = np.array([0.2, 3.0, 0.5, 0.4, 0.3, 0.0])

    def jitter(row):  # small enough to keep every ranking
        return np.tile(row, (layers, 1)) + 1e-4 * rng.random((layers, row.size))

    scores = {m: [] for m in nx.EXP2_METHODS}
    for _ in range(pairs):
        for m in nx.EXP2_METHODS:
            if m in ("globenc", "alti", "value_zeroing"):
                scores[m].append(jitter(self_dominant))
            elif m == "normxlogit":
                scores[m].append(jitter(normxlogit))
            elif m == "embedding_norm":
                scores[m].append(rng.random(6))
            elif m == "random":
                scores[m].append(rng.random((nx.RANDOM_SEEDS_EXP2, 6)))
            else:
                scores[m].append(rng.random((layers, 6)))
    evidence = [np.array([False, True, False, False, False, True]) for _ in range(pairs)]
    return scores, evidence, [5] * pairs


def test_without_position_takes_out_exactly_the_anchor():
    values = np.arange(24.0).reshape(4, 6)
    np.testing.assert_array_equal(nx.without_position(values, 5), values[:, :5])
    np.testing.assert_array_equal(nx.without_position(values, 2), values[:, [0, 1, 3, 4, 5]])
    np.testing.assert_array_equal(nx.without_position(np.arange(6.0), 0), np.arange(1.0, 6.0))
    scores, evidence, anchors = _constructed_pairs(3, 2)
    before = nx.alignment_values(scores, evidence, anchors, "softmax")[0]
    scores["normxlogit"][0][:, 5] = 99.0  # the anchor's score: no longer counted
    again = nx.alignment_values(scores, evidence, anchors, "softmax")[0]
    for key in ("dot", "ap"):
        np.testing.assert_array_equal(again[key], before[key])
    scores["normxlogit"][0][:, 4] = 99.0  # any other position's score still counts
    moved = nx.alignment_values(scores, evidence, anchors, "softmax")[0]
    row = nx.EXP2_METHODS.index("normxlogit")
    assert not np.allclose(moved["ap"][row, :, 0], before["ap"][row, :, 0])
    from heedful.evaluate.metrics import average_precision_score

    expected = average_precision_score(np.delete(scores["globenc"][1][0], 5), np.delete(evidence[1], 5))
    assert before["ap"][nx.EXP2_METHODS.index("globenc"), 0, 1] == pytest.approx(expected) == pytest.approx(0.5)
    lone = [np.array([False, False, False, False, False, True])] + evidence[1:]  # evidence = the anchor alone
    dropped = nx.alignment_values(scores, lone, anchors, "softmax")[0]
    assert np.isnan(dropped["ap"][:, :, 0]).all() and np.isfinite(dropped["ap"][row, :, 1:]).all()


def test_self_dominant_scorer_wins_with_the_anchor_and_loses_without(tmp_path):
    """GlobEnc¬-like scores that sit on the anchor align best while the anchor counts as evidence
    (AP 0.83 against NormXLogit's 0.67) and worst once it is taken out (0.5 against 1.0); the claim
    "NormXLogit ahead across almost all layers" reads the reading without the anchor."""
    from heedful.reproduce.normxlogit.claims import _claims_exp2
    from heedful.reproduce.normxlogit.statistics import layers_ahead
    from heedful.reproduce.toolkit import DOES_NOT_HOLD, HOLDS, count_verdict

    layers, pairs = 4, 30
    scores, evidence, anchors = _constructed_pairs(pairs, layers)
    labels = ["sv_agreement"] * 20 + ["anaphor_number"] * 10
    readings = {
        name: nx.summarise_alignment(*nx.alignment_values(scores, evidence, dropped, "softmax"), labels,
                                     skipped={}, seconds=0.0, model_name="lm@x")
        for name, dropped in (("with", None), ("without", anchors))
    }
    with_anchor, free = readings["with"], readings["without"]
    nxr, ge = nx.EXP2_METHODS.index("normxlogit"), nx.EXP2_METHODS.index("globenc")
    np.testing.assert_allclose(with_anchor.ap[[nxr, ge]], [[2 / 3] * layers, [5 / 6] * layers], atol=1e-9)
    np.testing.assert_allclose(free.ap[[nxr, ge]], [[1.0] * layers, [0.5] * layers], atol=1e-9)
    assert layers_ahead(with_anchor) == (0, 0) and layers_ahead(free) == (layers, layers)
    assert count_verdict(*reversed(layers_ahead(with_anchor)), layers).word == DOES_NOT_HOLD
    assert int(free.paradigms["sv_agreement"]["n"]) == 20 and free.paradigms["sv_agreement"]["ap_low"].shape == (
        len(nx.EXP2_METHODS), layers)
    al = replace(with_anchor, without_anchor=free)
    claims = {c: (number, verdict) for c, _, number, verdict in _claims_exp2(al)}
    number, verdict = next(v for c, v in claims.items() if c.startswith("NormXLogit outperforms"))
    assert verdict.word == HOLDS
    assert "without the anchor position (30 pairs): ahead of all three at 4 of 4 layers" in number
    assert "with the anchor counted (30 pairs): ahead of all three at 0 of 4 layers" in number
    text = "\n".join(nx.anchor_section(al))
    assert "### Without the anchor position" in text and "| sv_agreement (" in text and "| without | 20 |" in text
    nx._save_alignment(al, tmp_path / "al.json")
    back = nx._load_alignment(tmp_path / "al.json")
    np.testing.assert_allclose(back.without_anchor.ap, free.ap)
    np.testing.assert_allclose(back.without_anchor.versus["ap"], free.versus["ap"])
    np.testing.assert_allclose(back.versus["dot"], with_anchor.versus["dot"])
    assert _claims_exp2(replace(al, without_anchor=None))[0][3].word == "cannot be tested here"
