"""Faithfulness metrics against direct, one-example-at-a-time hand computations that follow each
paper's reference code, on tiny seeded models; removal strategies; metric arithmetic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from heedful.errors import InputError
from heedful.evaluate import PRESETS, evaluate, get_protocol
from heedful.evaluate.evaluation import ModelInput
from heedful.evaluate.metrics import METRICS, Measurements
from heedful.evaluate.perturbation import Outputs, forward_removed, prepare

TEXTS = [
    "a charming and often affecting journey",
    "the movie was dull and far too long",
    "what a waste of a talented cast",
]
LONG = "the plot is predictable yet the actors are wonderful and we watched it twice and loved every minute of the film"


def _with_scores(expls, seed=0):
    """The explanations with distinct pseudo-random scores (a known ranking, signs mixed)."""
    rng = np.random.default_rng(seed)
    return [dataclasses.replace(e, scores=rng.normal(size=len(e.tokens))) for e in expls]


@torch.no_grad()
def _probs(model, ids: list[int]) -> np.ndarray:
    logits = model.hf_model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    return torch.softmax(logits[0].float(), dim=-1).double().numpy()


def _ids(model, text: str) -> list[int]:
    return model.tokenizer(text)["input_ids"]


# --------------------------------------------------------------------------- NormXLogit
def _normxlogit_by_hand(model, text, scores):
    """The NormXLogit notebook: rank all non-pad positions but [CLS] by score; mask the top
    int(N * k) (comprehensiveness) or all but them (sufficiency) with [MASK]; predicted label."""
    ids = _ids(model, text)
    n = len(ids)
    p0 = _probs(model, ids)
    pred = int(p0.argmax())
    ranking = [int(i) for i in np.argsort(-scores, kind="stable") if i != 0]
    comp, suff = [], []
    for k in PRESETS["normxlogit"].ratios:
        c = int(n * k)
        masked = list(ids)
        for i in ranking[:c]:
            masked[i] = model.tokenizer.mask_token_id
        comp.append(p0[pred] - _probs(model, masked)[pred])
        kept = list(ids)
        for i in ranking[c:]:
            kept[i] = model.tokenizer.mask_token_id
        suff.append(p0[pred] - _probs(model, kept)[pred])
    return np.array(comp), np.array(suff)


def test_aopc_and_sufficiency_match_the_normxlogit_notebook(tiny):
    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"))
    result = evaluate(model, expls, ["aopc", "sufficiency"], "normxlogit", batch_size=2)
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        comp, suff = _normxlogit_by_hand(model, text, e.scores)
        np.testing.assert_allclose(result["aopc"].per_example.curves[b], comp, atol=2e-6)
        np.testing.assert_allclose(result["sufficiency"].per_example.curves[b], suff, atol=2e-6)
        assert result["aopc"].per_example.values[b] == pytest.approx(comp[1:10].mean(), abs=2e-6)
        assert result["sufficiency"].per_example.values[b] == pytest.approx(suff[1:10].mean(), abs=2e-6)
    assert result["aopc"].summary.value == pytest.approx(result["aopc"].per_example.values.mean())
    np.testing.assert_allclose(result["aopc"].summary.curve, result["aopc"].per_example.curves.mean(axis=0))


def test_batching_does_not_change_values(tiny):
    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"))
    one = evaluate(model, expls, ["aopc", "log_odds", "tau_loo"], "normxlogit", batch_size=1, chunk=2)
    many = evaluate(model, expls, ["aopc", "log_odds", "tau_loo"], "normxlogit", batch_size=3)
    for name in one:
        np.testing.assert_allclose(one[name].per_example.values, many[name].per_example.values, atol=1e-6)


# --------------------------------------------------------------------------- Mask-LRP
def _mask_lrp_by_hand(model, text, scores, gold):
    """LinxinS97/Mask-LRP evaluate_explanability.py + utils/metrices.py, re-implemented."""
    ids = _ids(model, text)
    words = model.tokenizer.convert_ids_to_tokens(ids)
    total = len(words)
    nums = list(dict.fromkeys(int(g) for g in np.round(np.linspace(0, 1, 10) * total)))[1:]
    p0 = _probs(model, ids)[gold]
    sorted_idx = np.argsort(-scores, kind="stable")
    probs = []
    for num in nums:
        chosen, i = [], 0
        while len(chosen) < num and i != len(sorted_idx) - 1:  # never reaches the last entry
            if words[sorted_idx[i]] not in ("[CLS]", "[SEP]"):
                chosen.append(int(sorted_idx[i]))
            i += 1
        replaced = list(ids)
        for j in chosen:
            replaced[j] = 0
        probs.append(_probs(model, replaced)[gold])
    probs = np.array(probs)
    return p0 - probs, np.log(probs / p0)


def test_aopc_and_log_odds_match_mask_lrp(tiny):
    model = tiny("bert")
    assert len(_ids(model, LONG)) >= 20
    gold = 2
    protocol = get_protocol("mask-lrp")
    from heedful.engine.targets import Target

    expls = _with_scores(model.explain([LONG, TEXTS[0]], "saliency", Target("given", gold)), seed=4)
    inputs = [ModelInput(str(i), e.text, None, Target("given", gold), (), gold, float("nan")) for i, e in enumerate(expls)]
    result = evaluate(model, expls, ["aopc", "log_odds", "accuracy"], protocol, inputs)
    aopc, lodds = _mask_lrp_by_hand(model, LONG, expls[0].scores, gold)
    np.testing.assert_allclose(result["aopc"].per_example.curves[0], aopc, atol=2e-6)
    np.testing.assert_allclose(result["log_odds"].per_example.curves[0], lodds, atol=1e-5)
    assert result["aopc"].per_example.values[0] == pytest.approx(aopc.mean(), abs=2e-6)
    # the short text is below min_length 20: skipped, not averaged in
    assert np.isnan(result["aopc"].per_example.values[1]) and result["aopc"].summary.n == 1


# --------------------------------------------------------------------------- ferret
def _ferret_by_hand(model, text, scores):
    """g8a9/ferret AOPC comprehensiveness / sufficiency / tau-LOO with default arguments."""
    tok = model.tokenizer
    full = _ids(model, text)
    p_all = _probs(model, full)
    target = int(p_all.argmax())
    base = p_all[target]
    ids, s = full[1:-1], scores[1:-1]

    def prob(token_ids):
        return _probs(model, _ids(model, tok.decode(token_ids, skip_special_tokens=False)))[target]

    comp, suff, last = [], [], None
    for p in np.arange(0.1, 1.1, 0.1):
        v = int(p * len(s))
        if not 0 < v <= len(s):
            continue
        top = [int(i) for i in np.argsort(s)[-v:][::-1] if s[i] > 0]
        if not top or (last is not None and set(top) == last):
            continue
        last = set(top)
        comp.append(base - prob(list(np.delete(np.array(ids), top))))
        suff.append(base - prob(list(np.array(ids)[np.sort(top)])))
    loo = np.array([base - prob(ids[:i] + ids[i + 1 :]) for i in range(len(ids))])
    return (np.mean(comp) if comp else 0.0), (np.mean(suff) if suff else 1.0), kendalltau(loo, s).statistic


def test_comprehensiveness_sufficiency_tau_match_ferret(tiny):
    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"), seed=1)
    result = evaluate(model, expls, ["aopc", "sufficiency", "tau_loo"], "ferret")
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        comp, suff, tau = _ferret_by_hand(model, text, e.scores)
        assert result["aopc"].per_example.values[b] == pytest.approx(comp, abs=2e-6)
        assert result["sufficiency"].per_example.values[b] == pytest.approx(suff, abs=2e-6)
        assert result["tau_loo"].per_example.values[b] == pytest.approx(tau, abs=1e-9)


def test_ferret_defaults_when_no_rationale(tiny):
    model = tiny("bert")
    expls = [dataclasses.replace(e, scores=-np.ones(len(e.tokens))) for e in model.explain(TEXTS[:2], "saliency")]
    result = evaluate(model, expls, ["aopc", "sufficiency"], "ferret")
    assert result["aopc"].per_example.values.tolist() == [0.0, 0.0]
    assert result["sufficiency"].per_example.values.tolist() == [1.0, 1.0]



def test_ferret_runs_each_distinct_perturbed_text_once(tiny):
    """Explanations that leave the same texts (here: every explanation twice) share their
    perturbed rows and their originals: nothing runs twice, and the values are those of one copy."""
    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"), seed=1)
    counter = model.adapter.counter
    before = counter.forward
    once = evaluate(model, expls, ["aopc", "sufficiency"], "ferret")
    rows_once = counter.forward - before
    before = counter.forward
    twice = evaluate(model, expls + expls, ["aopc", "sufficiency"], "ferret")
    assert counter.forward - before == rows_once
    for name in ("aopc", "sufficiency"):
        values = twice[name].per_example.values
        np.testing.assert_array_equal(values[: len(TEXTS)], values[len(TEXTS) :])
        np.testing.assert_allclose(values[: len(TEXTS)], once[name].per_example.values, atol=1e-6)

# --------------------------------------------------------------------------- removal strategies
class _Recorder:
    """Wraps adapter.forward and keeps what it was called with."""

    def __init__(self, adapter):
        self.adapter, self.calls, self.original = adapter, [], adapter.forward

    def __enter__(self):
        def record(batch, anchor, **kw):
            self.calls.append((anchor.clone(), kw["input_ids"].clone(), kw["attention_mask"].clone()))
            return self.original(batch, anchor, **kw)

        self.adapter.forward = record
        return self

    def __exit__(self, *exc):
        del self.adapter.forward


@pytest.mark.parametrize("removal", ["mask", "pad"])
def test_replacement_keeps_length(tiny, removal):
    model = tiny("bert")
    protocol = get_protocol("default", removal=removal, ratios=(0.5,))
    prepared = prepare(model.adapter, _with_scores(model.explain(TEXTS, "saliency")), protocol)
    remove = prepared.rankable & (prepared.ranks < 2)
    token = model.tokenizer.mask_token_id if removal == "mask" else model.tokenizer.pad_token_id
    with _Recorder(model.adapter) as rec:
        forward_removed(prepared, torch.arange(3), remove, removal)
    _, ids, mask = rec.calls[0]
    assert ids.shape == prepared.batch.input_ids.shape
    expected = torch.where(remove, torch.full_like(prepared.batch.input_ids, token), prepared.batch.input_ids)
    # rows run longest first: compare them as a set of rows
    assert sorted(map(tuple, ids.tolist())) == sorted(map(tuple, expected.tolist()))
    assert sorted(map(tuple, mask.tolist())) == sorted(map(tuple, prepared.batch.attention_mask.tolist()))


def test_deletion_shortens_and_moves_decoder_anchor(tiny):
    model = tiny("gpt2")
    assert model.adapter.removal_token_id is None  # causal LMs delete
    protocol = get_protocol("normxlogit", ratios=(0.0, 0.2, 0.5, 0.8), mean_over=None)
    expls = _with_scores(model.explain(TEXTS, "saliency"), seed=2)
    prepared = prepare(model.adapter, expls, protocol)
    remove = prepared.rankable & (prepared.ranks < 3)
    with _Recorder(model.adapter) as rec:
        forward_removed(prepared, torch.arange(3), remove, "auto")
    anchor, ids, mask = rec.calls[0]
    lengths = prepared.batch.lengths - 3
    assert ids.shape[1] == int(lengths.max()) and torch.equal(mask.sum(dim=1), lengths)
    assert torch.equal(anchor, lengths - 1)
    # and the whole curve equals deleting the tokens by hand and running the shorter text
    result = evaluate(model, expls, ["aopc"], protocol)
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        ids0 = _ids(model, text)
        p0 = _probs(model, ids0)
        pred = int(p0.argmax())
        ranking = list(np.argsort(-e.scores, kind="stable"))
        for j, k in enumerate(protocol.ratios):
            drop = set(ranking[: int(len(ids0) * k)])
            kept = [t for i, t in enumerate(ids0) if i not in drop]
            expected = p0[pred] - _probs(model, kept)[pred]
            assert result["aopc"].per_example.curves[b, j] == pytest.approx(expected, abs=2e-6)


def test_masked_lm_target_position_is_never_removed(tiny):
    model = tiny("bert", "masked_lm")
    texts = ["the movie was [MASK] and far too long", "a [MASK] and often affecting journey"]
    expls = model.explain(texts, "saliency")
    prepared = prepare(model.adapter, expls, get_protocol("default", specials="include"))
    anchors = prepared.target.anchor
    assert not prepared.rankable[torch.arange(2), anchors].any()
    result = evaluate(model, expls, ["aopc", "accuracy"], get_protocol("default", removal="delete"))
    assert np.isfinite(result["aopc"].per_example.values).all()


# --------------------------------------------------------------------------- metric arithmetic
def _measurements(protocol, original, remove, keep=None, valid=None, **kw) -> Measurements:
    def outs(values, pred=None):
        values = np.asarray(values, dtype=float)
        pred = np.zeros(values.shape, dtype=np.int64) if pred is None else np.asarray(pred)
        return Outputs(values, values, np.log(values), pred, values)

    original = np.asarray(original, dtype=float)
    remove = np.asarray(remove, dtype=float)
    valid = np.ones(remove.shape, dtype=bool) if valid is None else np.asarray(valid)
    return Measurements(
        protocol=protocol, n=len(original), x=protocol.curve_ratios, original=outs(original, kw.get("pred0")),
        remove=outs(remove, kw.get("pred")),
        remove_valid=valid, keep=None if keep is None else outs(keep), keep_valid=valid,
        gold_class=kw.get("gold"), gold_value=kw.get("gold_value"),
    )


def test_curve_metrics_by_hand():
    p = get_protocol("default", ratios=(0.5, 1.0), mean_over=None)
    m = _measurements(p, [0.8, 0.6], [[0.4, 0.2], [0.6, 0.3]], keep=[[0.7, 0.8], [0.5, 0.6]])
    np.testing.assert_allclose(METRICS["aopc"].compute(m).values, [(0.4 + 0.6) / 2, (0.0 + 0.3) / 2])
    np.testing.assert_allclose(METRICS["sufficiency"].compute(m).values, [(0.1 + 0.0) / 2, (0.1 + 0.0) / 2])
    np.testing.assert_allclose(METRICS["log_odds"].compute(m).values, [np.mean(np.log([0.5, 0.25])), np.mean(np.log([1.0, 0.5]))])
    # deletion: trapezoid over (0, p0), (0.5, p.5), (1, p1); insertion over the keep curve
    np.testing.assert_allclose(METRICS["deletion"].compute(m).values, [0.5 * (0.8 + 0.4) / 2 + 0.5 * (0.4 + 0.2) / 2, 0.5 * 1.2 / 2 + 0.5 * 0.9 / 2])
    np.testing.assert_allclose(METRICS["insertion"].compute(m).values, [0.75, 0.55])
    # invalid ratios are left out of the mean
    m2 = _measurements(p, [0.8], [[0.4, 0.2]], valid=[[True, False]])
    assert METRICS["aopc"].compute(m2).values[0] == pytest.approx(0.4)


def test_accuracy_and_pearson_by_hand():
    p = get_protocol("default", ratios=(0.5, 1.0), mean_over=None)
    pred = np.array([[1, 0], [1, 1], [0, 0]])
    m = _measurements(p, [0.9, 0.9, 0.9], [[0.5, 0.5]] * 3, pred=pred, pred0=[1, 1, 0], gold=np.array([1, 1, -1]))
    acc = METRICS["accuracy"].compute(m)
    np.testing.assert_allclose(acc.curves, [[1, 0], [1, 1], [1, 1]])  # no gold: vs original prediction
    drop = METRICS["accuracy_drop"].compute(m)
    assert drop.values.mean() == pytest.approx(1 - acc.values.mean())
    # Pearson r per ratio over examples, against gold values
    values = np.array([[1.0, 3.0], [2.0, 1.0], [3.0, 2.0], [4.0, 4.0]])
    gold = np.array([1.0, 2.0, 3.0, 4.0])
    m = _measurements(p, [1.0, 2.0, 3.0, 4.0], values, gold_value=gold)
    from heedful.evaluate.metrics import aggregate

    per = METRICS["pearson"].compute(m)
    summary = aggregate(METRICS["pearson"], per, p)
    expected = [np.corrcoef(values[:, j], gold)[0, 1] for j in range(2)]
    np.testing.assert_allclose(summary.curve, expected)
    assert summary.value == pytest.approx(np.mean(expected))
    drop = aggregate(METRICS["pearson_drop"], METRICS["pearson_drop"].compute(m), p)
    np.testing.assert_allclose(drop.curve, 1.0 - np.array(expected))


def test_task_checks(tiny):
    model = tiny("bert", "regression")
    expls = model.explain(TEXTS, "saliency")
    with pytest.raises(InputError, match="class probabilities"):
        evaluate(model, expls, ["log_odds"])
    with pytest.raises(InputError, match="regression models"):
        evaluate(tiny("bert"), tiny("bert").explain(TEXTS, "saliency"), ["pearson"])
    with pytest.raises(InputError, match="unknown metric"):
        evaluate(model, expls, ["aopc2"])
    inputs = [ModelInput(str(i), t, None, None, (), -1, float(i)) for i, t in enumerate(TEXTS)]
    result = evaluate(model, expls, ["pearson", "deletion"], "normxlogit", inputs)
    assert result["pearson"].summary.curve.shape == (11,)


def test_mean_aggregate_carries_a_95_percent_bootstrap_interval():
    """The interval of a mean over examples: zero width for a constant, and for a normal sample
    about the normal theory's ``mean ± 1.96 sd / sqrt(n)`` (NaNs left out)."""
    from heedful.evaluate.metrics import PerExample, mean_aggregate

    protocol = get_protocol("ferret")
    flat = mean_aggregate(PerExample(np.full(50, 0.3)), protocol)
    assert flat.low == pytest.approx(0.3) and flat.high == pytest.approx(0.3)
    values = np.random.default_rng(7).normal(0.5, 0.2, 2000)
    values[::100] = np.nan
    s = mean_aggregate(PerExample(values), protocol)
    finite = values[np.isfinite(values)]
    half = 1.96 * finite.std(ddof=1) / np.sqrt(finite.size)
    assert s.n == finite.size and s.low < s.value < s.high
    assert s.high - s.low == pytest.approx(2 * half, rel=0.15)
    assert abs((s.low + s.high) / 2 - finite.mean()) < 0.2 * half
    assert not mean_aggregate(PerExample(np.array([0.4])), protocol).has_interval  # one example: none


def test_pearson_interval_resamples_the_examples():
    """The Pearson metrics' 95 % interval: r recomputed per ratio on every resample of the
    examples (np.corrcoef in a loop here), the mean over ratios, its 2.5 / 97.5 percentiles."""
    from heedful.evaluate.intervals import bootstrap_indices
    from heedful.evaluate.metrics import aggregate

    p = get_protocol("default", ratios=(0.5, 1.0), mean_over=None)
    rng = np.random.default_rng(3)
    gold = rng.normal(size=40)
    values = 10 + gold[:, None] * np.array([0.8, 0.3]) + rng.normal(size=(40, 2))  # positive: the outputs' logs
    original = 10 + gold + 0.5 * rng.normal(size=40)
    m = _measurements(p, original, values, gold_value=gold)
    for name in ("pearson", "pearson_drop"):
        summary = aggregate(METRICS[name], METRICS[name].compute(m), p)
        boot = []
        for idx in bootstrap_indices(40):
            r = [np.corrcoef(values[idx, j], gold[idx])[0, 1] for j in range(2)]
            if name == "pearson_drop":
                r0 = np.corrcoef(original[idx], gold[idx])[0, 1]
                r = [r0 - v for v in r]
            boot.append(np.mean(r))
        low, high = np.percentile(boot, [2.5, 97.5])
        assert summary.low < summary.value < summary.high
        assert (summary.low, summary.high) == pytest.approx((low, high), abs=1e-9)


def test_seed_interval_is_that_of_the_mean_over_seeds():
    """A stochastic method's interval: Pearson recomputed per resample for each seed (the same
    resamples), averaged over the seeds, 2.5 / 97.5 percentiles; a mean metric's: the bootstrap of
    the per-example means over the seeds."""
    from heedful.evaluate.bench import _seed_interval
    from heedful.evaluate.intervals import bootstrap_indices, bootstrap_mean

    p = get_protocol("default", ratios=(0.5, 1.0), mean_over=None)
    rng = np.random.default_rng(5)
    gold = rng.normal(size=30)
    seeds = []
    for _ in range(2):
        values = 10 + gold[:, None] * np.array([0.5, 0.2]) + rng.normal(size=(30, 2))
        seeds.append((values, _measurements(p, 10 + gold, values, gold_value=gold)))
    per = [METRICS["pearson"].compute(m) for _, m in seeds]
    low, high = _seed_interval(METRICS["pearson"], per, p)
    boot = [
        np.mean([np.mean([np.corrcoef(v[idx, j], gold[idx])[0, 1] for j in range(2)]) for v, _ in seeds])
        for idx in bootstrap_indices(30)
    ]
    assert (low, high) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])), abs=1e-9)
    aopc = [METRICS["aopc"].compute(m) for _, m in seeds]
    expected = bootstrap_mean(np.mean([a.values for a in aopc], axis=0))[1:]
    assert _seed_interval(METRICS["aopc"], aopc, p) == pytest.approx(expected)


# --------------------------------------------------------------------------- soft (Zhao & Aletras 2023)
@torch.no_grad()
def _soft_by_hand(model, text: str, scores: np.ndarray) -> tuple[float, float]:
    """Zhao & Aletras 2023 Eq. 2-3 as a plain loop: scores min-max normalised over the content
    tokens; every word-embedding dimension of token i kept with probability 1 - s_i (soft
    comprehensiveness) or s_i (soft sufficiency), one uniform draw per text (seed 0)."""
    enc = model.tokenizer(text, return_special_tokens_mask=True)
    ids, special = torch.tensor([enc["input_ids"]]), enc["special_tokens_mask"]
    embeds = model.hf_model.get_input_embeddings()(ids)[0]  # [N, E]
    content = [i for i in range(len(special)) if not special[i]]
    low, high = min(scores[i] for i in content), max(scores[i] for i in content)
    draw = torch.rand(embeds.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p0 = _probs(model, enc["input_ids"])
    label = int(p0.argmax())
    values = []
    for erase in (True, False):
        perturbed = embeds.clone()
        for i in content:
            s = (scores[i] - low) / (high - low)
            keep_probability = 1 - s if erase else s
            for d in range(embeds.shape[1]):
                if not draw[i, d] < keep_probability:
                    perturbed[i, d] = 0.0
        p = torch.softmax(model.hf_model(inputs_embeds=perturbed[None]).logits[0].float(), -1).double()[label]
        values.append(max(0.0, p0[label] - float(p)))
    return values[0], 1.0 - values[1]


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_soft_comprehensiveness_and_soft_sufficiency_equal_a_plain_loop(tiny, family):
    model = tiny(family)
    expls = _with_scores(model.explain(TEXTS, "saliency"))
    protocol = get_protocol("default", specials="exclude")  # the content tokens are the rankable ones
    result = evaluate(model, expls, ["soft_comprehensiveness", "soft_sufficiency"], protocol, batch_size=2)
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        comp, suff = _soft_by_hand(model, text, np.asarray(e.scores))
        assert result["soft_comprehensiveness"].per_example.values[b] == pytest.approx(comp, abs=2e-6)
        assert result["soft_sufficiency"].per_example.values[b] == pytest.approx(suff, abs=2e-6)
    # every score counts: a ranking-preserving change of the scores changes the soft metrics
    squeezed = [dataclasses.replace(e, scores=np.asarray(e.scores) ** 3) for e in expls]
    again = evaluate(model, squeezed, ["soft_comprehensiveness"], protocol)
    assert not np.allclose(again["soft_comprehensiveness"].per_example.values, result["soft_comprehensiveness"].per_example.values)


def test_soft_comprehensiveness_refuses_a_regression_model_in_one_line(tiny):
    model = tiny("bert", "regression")
    with pytest.raises(InputError, match="soft_comprehensiveness needs class probabilities"):
        evaluate(model, model.explain(TEXTS, "saliency"), ["soft_comprehensiveness"])


def test_soft_sufficiency_measurements_survive_the_results_store_records(tiny):
    from heedful.evaluate.evaluation import from_records, measure, to_records

    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"))
    protocol = get_protocol("default")
    m = measure(model.adapter, expls, protocol, ["soft"])
    back = from_records(protocol, {"soft": to_records(m, "soft")}, len(expls))
    for name in ("soft_comprehensiveness", "soft_sufficiency"):
        np.testing.assert_array_equal(METRICS[name].compute(back).values, METRICS[name].compute(m).values)
