"""Context attribution metrics (heedful.evaluate.context) against plain computations: top-k
source accuracy, token precision@k, LDS against scipy's Spearman, the source ablations against a
plain forward per perturbed text, bootstrap intervals, ``heedful bench`` on context data (stored,
resumed, reported), and bad input."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny
from scipy.stats import spearmanr

from heedful.datasets import Dataset
from heedful.datasets.context import context_example
from heedful.engine.sources import token_sources
from heedful.errors import HeedfulError, InputError
from heedful.evaluate import (
    METRICS,
    ResultsStore,
    bootstrap_mean,
    evaluate,
    get_protocol,
    model_inputs,
)
from heedful.evaluate.bench import BenchSpec, per_example_from_store, run_bench
from heedful.evaluate.context import (
    SharedAblations,
    attach_context,
    lds_score,
    measure_ablations,
    source_hit,
    token_precision,
)
from heedful.evaluate.metrics import Measurements
from heedful.evaluate.protocol import LATER_FIELDS, Protocol
from heedful.evaluate.report import markdown
from heedful.explanation import Explanation, TargetInfo

CONTEXT_METRICS = ["source_top1", "source_top3", "precision_at_k", "source_comprehensiveness", "lds"]


# ---------------------------------------------------------------------------- plain metrics
def test_source_hit_against_a_plain_loop():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores = rng.integers(0, 4, size=rng.integers(1, 7)).astype(float)  # ties on purpose
        answer = int(rng.integers(len(scores)))
        for k in (1, 2, 3):
            above = sum(1 for j in range(len(scores)) if j != answer and scores[j] >= scores[answer])
            assert source_hit(scores, answer, k) == float(above < k)
    assert np.isnan(source_hit(np.ones(3), -1, 1))
    assert source_hit(np.ones(3), 0, 1) == 0.0  # constant scores never hit
    assert source_hit(np.array([0.1, 0.9, 0.5]), 1, 1) == 1.0


def test_token_precision_against_a_plain_loop():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        scores = rng.integers(-3, 4, size=n).astype(float)
        considered = rng.random(n) < 0.8
        evidence = rng.random(n) < 0.3
        k = int(rng.integers(1, 25))
        keep = [i for i in range(n) if considered[i]]
        top = sorted(keep, key=lambda i: (-scores[i], i))[:k]
        if not any(evidence[i] for i in keep):
            assert np.isnan(token_precision(scores, evidence, considered, k))
            continue
        assert token_precision(scores, evidence, considered, k) == pytest.approx(sum(evidence[i] for i in top) / len(top))


def test_lds_equals_scipy_spearman_on_a_hand_built_case():
    masks = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1], [1, 1, 1], [0, 1, 0]], dtype=bool)
    scores = np.array([2.0, -1.0, 0.5])
    outputs = np.array([-1.0, -3.0, -0.5, -2.5, -0.7, -4.0])
    predicted = [2.5, -0.5, 1.0, 0.5, 1.5, -1.0]  # kept sources' scores summed, by hand
    expected = spearmanr(predicted, outputs).statistic
    assert lds_score(masks, scores, outputs) == pytest.approx(expected)
    assert lds_score(masks, scores, outputs) == pytest.approx(27 / 35)  # 1 - 6 * 8 / (6 * 35): rank differences 2, 0, 2, 0, 0, 0
    assert np.isnan(lds_score(masks, np.zeros(3), outputs))  # constant prediction: undefined


# ---------------------------------------------------------------------------- hand-made explanations
def _explanation(text, tokens, offsets, scores, sources, special=None) -> Explanation:
    n = len(tokens)
    return Explanation(
        text=text, text_pair=None, tokens=tokens, offsets=offsets, word_ids=list(range(n)),
        special=special or [False] * n, segments=[0] * n, scores=np.asarray(scores, dtype=float),
        target=TargetInfo("given", [7], " x", n - 1), method="hand", sources=sources,
    )


def test_metrics_of_hand_made_explanations():
    text = "Aa bb. Cc dd. Ee ff.\n\nQq"
    tokens = ["Aa", " bb", ".", " Cc", " dd", ".", " Ee", " ff", ".", "\n\n", "Qq"]
    offsets = [(0, 2), (2, 5), (5, 6), (6, 9), (9, 12), (12, 13), (13, 16), (16, 19), (19, 20), (20, 22), (22, 24)]
    sources = [(0, 6), (7, 13), (14, 20)]
    first = _explanation(text, tokens, offsets, [0, 0, 0, 3, 2, 1, 0, 1, 0, 0, 5], sources)  # source 1 highest
    second = _explanation(text, tokens, offsets, [4, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], sources)  # source 0 highest
    protocol = get_protocol("default", precision_k=2)
    m = Measurements(protocol, 2)
    m.scores = [first.scores, second.scores]
    m.evidence = [np.array([o[0] < 13 and o[1] > 7 for o in offsets])] * 2  # the tokens of " Cc dd."
    attach_context(m, [first, second], [1, 1])
    assert [s.tolist() for s in m.source_scores] == [[0, 6, 1], [4, 3, 0]]
    assert METRICS["source_top1"].compute(m).values.tolist() == [1.0, 0.0]
    assert METRICS["source_top3"].compute(m).values.tolist() == [1.0, 1.0]
    per = METRICS["precision_at_k"].compute(m)
    # top 2: "Qq" (5) and " Cc" (3) -> 1 of 2; "Aa" (4) and " Cc" (the first of three tied at 1) -> 1 of 2
    assert per.values.tolist() == [0.5, 0.5]
    assert per.extras == [{"hits": 1.0, "answer_tokens": 3.0}] * 2


def test_bootstrap_interval_of_a_context_metric_is_bootstrap_mean():
    from heedful.evaluate.context import bootstrap_aggregate
    from heedful.evaluate.metrics import PerExample

    values = np.array([0.0, 1.0, np.nan, 1.0, 1.0, 0.0, 1.0])
    summary = bootstrap_aggregate(PerExample(values), get_protocol("default"))
    mean, low, high = bootstrap_mean(values[np.isfinite(values)])
    assert (summary.value, summary.low, summary.high, summary.n) == (mean, low, high, 6)
    assert summary.has_interval and low < mean < high


# ---------------------------------------------------------------------------- ablations on a model
CONTEXTS = ["It rained. We sat in. The cat slept.", "A dog ran. The sky was red. Tea."]


@pytest.fixture(scope="module")
def lm(tiny):
    return tiny("llama", "causal_lm")


def _log_prob(model, ids: list[int], position: int, token: int) -> float:
    with torch.no_grad():
        logits = model.hf_model(input_ids=torch.tensor([ids])).logits[0, position].double()
    return float(torch.log_softmax(logits, dim=-1)[token])


def test_ablations_against_a_plain_forward_per_text(lm):
    data = Dataset("c", "test", [context_example(str(i), c, "So") for i, c in enumerate(CONTEXTS)], task="context")
    inputs = model_inputs(data, lm.adapter)
    explanations = [lm.explain(i.text, "grad_x_input", sources=list(i.sources)) for i in inputs]
    protocol = get_protocol("default", source_ks=(1, 2, 5), lds_ablations=5)
    found = measure_ablations(lm.adapter, explanations, protocol)
    tokenizer = lm.adapter.tokenizer
    for b, e in enumerate(explanations):
        ids = tokenizer.convert_tokens_to_ids(e.raw_tokens)
        token = e.target.indices[0]
        owners = np.array(token_sources(e.offsets, e.sources))
        assert found.original[b] == pytest.approx(_log_prob(lm, ids, len(ids) - 1, token), abs=1e-5)
        order = np.argsort(-e.source_scores().scores, kind="stable")
        for j, k in enumerate((1, 2, 5)):
            if k > len(e.sources):
                assert np.isnan(found.removed[b, j])
                continue
            kept = [t for t, o in zip(ids, owners, strict=True) if o not in order[:k]]
            assert found.removed[b, j] == pytest.approx(_log_prob(lm, kept, len(kept) - 1, token), abs=1e-5)
        # the random masks come from a generator seeded from the text (so every method gets them)
        generator = torch.Generator().manual_seed(zlib.crc32(f"{e.text}\x00".encode()))
        assert (found.masks[b] == (torch.rand(5, len(e.sources), generator=generator) < 0.5).numpy()).all()
        for i, keep in enumerate(found.masks[b]):
            kept = [t for t, o in zip(ids, owners, strict=True) if o < 0 or keep[o]]
            assert found.outputs[b][i] == pytest.approx(_log_prob(lm, kept, len(kept) - 1, token), abs=1e-5)


def test_span_targets_sum_the_span_log_probabilities(lm):
    example = context_example("0", CONTEXTS[0], "So", " ok")
    data = Dataset("c", "test", [example], task="context")
    (item,) = model_inputs(data, lm.adapter)
    expl = lm.explain(item.text, "saliency", item.target, sources=list(item.sources))
    assert expl.target.positions is not None and len(expl.target.indices) > 1
    found = measure_ablations(lm.adapter, [expl], get_protocol("default", source_ks=(1,), lds_ablations=3))
    ids = lm.adapter.tokenizer.convert_tokens_to_ids(expl.raw_tokens)
    owners = np.array(token_sources(expl.offsets, expl.sources))
    top = int(np.argmax(expl.source_scores().scores))
    kept = [i for i, (t, o) in enumerate(zip(ids, owners, strict=True)) if o != top]
    shift = len(ids) - len(kept)
    plain = sum(
        _log_prob(lm, [ids[i] for i in kept], p - shift, c) for p, c in zip(expl.target.positions, expl.target.indices, strict=True)
    )
    assert found.removed[0, 0] == pytest.approx(plain, abs=1e-5)


def test_shared_ablations_run_once_for_every_method(lm):
    data = Dataset("c", "test", [context_example(str(i), c, "So") for i, c in enumerate(CONTEXTS)], task="context")
    inputs = model_inputs(data, lm.adapter)
    protocol = get_protocol("default", lds_ablations=6)
    shared = SharedAblations()
    counter = lm.adapter.counter
    found = {}
    for method in ("grad_x_input", "saliency"):
        expl = [lm.explain(i.text, method, sources=list(i.sources)) for i in inputs]
        counter.reset()
        found[method] = measure_ablations(lm.adapter, expl, protocol, shared)
        found[method + " forward"] = counter.forward
    rows = [1 + sum(k <= len(i.sources) for k in protocol.source_ks) for i in inputs]
    assert found["grad_x_input forward"] == sum(rows) + 2 * 6  # the first method runs the random ablations
    assert found["saliency forward"] == sum(rows)  # the second reuses them
    for b in range(2):
        assert (found["saliency"].masks[b] == found["grad_x_input"].masks[b]).all()
        assert np.allclose(found["saliency"].outputs[b], found["grad_x_input"].outputs[b])


def test_evaluate_gives_the_plain_metrics(lm):
    rows = [context_example("0", CONTEXTS[0], "So", answer_source=2), context_example("1", CONTEXTS[1], "So", answer_span=(11, 27))]
    data = Dataset("c", "test", rows, task="context")
    inputs = model_inputs(data, lm.adapter)
    expl = [lm.explain(i.text, "grad_x_input", sources=list(i.sources)) for i in inputs]
    protocol = get_protocol("default", lds_ablations=8)
    got = evaluate(lm, expl, CONTEXT_METRICS, protocol, inputs)
    ablations = measure_ablations(lm.adapter, expl, protocol)
    for b, (e, i) in enumerate(zip(expl, inputs, strict=True)):
        pooled = e.source_scores().scores
        assert got["source_top1"].per_example.values[b] == float(np.argmax(pooled) == i.answer_source)
        drops = ablations.original[b] - ablations.removed[b]
        assert got["source_comprehensiveness"].per_example.values[b] == pytest.approx(np.nanmean(drops))
        predicted = ablations.masks[b].astype(float) @ pooled
        assert got["lds"].per_example.values[b] == pytest.approx(spearmanr(predicted, ablations.outputs[b]).statistic)
    assert got["source_comprehensiveness"].x.tolist() == [1, 3, 5]
    assert got["lds"].summary.has_interval


# ---------------------------------------------------------------------------- the bench
ROWS = [
    {"context": "It rained. We sat in. The cat slept.", "query": "So", "target": " x", "answer_source": 1},
    {"context": "A dog ran. The sky was red. Tea.", "query": "Then", "answer_span": [11, 27]},
    {"context": "Big sun. Hot day. Cold.", "query": "So", "target": " y"},
    {"context": "One. Two. Three. Four.", "query": "Q", "answer_source": 3, "id": "four"},
]


def _context_file(path) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return str(path)


@pytest.fixture
def context_file(tmp_path):
    return _context_file(tmp_path / "ctx.jsonl")


def _spec(lm, data, out, **kw) -> BenchSpec:
    base = dict(
        model=lm, dataset=data, methods=["saliency", "grad_x_input"], metrics=CONTEXT_METRICS,
        protocol=get_protocol("default", lds_ablations=6), out=out, batch_size=3, model_label="tiny-llama",
    )
    base.update(kw)
    return BenchSpec(**base)


def test_bench_stores_resumes_and_reports_context_metrics(lm, context_file, tmp_path):
    spec = _spec(lm, context_file, tmp_path / "out")
    result = run_bench(spec, progress=False)
    assert result.n_examples == 4 and result.computed["metrics"] == 2 * 4 * len(CONTEXT_METRICS)
    with ResultsStore(result.store_path) as store:
        run = next(r for r in result.runs if r.method == "grad_x_input")
        ids = ["0", "1", "2", "four"]
        stored = store.get_explanations(run.key, ids)
        expl = [stored[i] for i in ids]
        assert expl[0].sources == [(0, 10), (11, 21), (22, 36)] and expl[0].target.positions is not None
        from heedful import datasets

        inputs = model_inputs(datasets.load(context_file), lm.adapter)
        again = evaluate(lm, expl, CONTEXT_METRICS, spec.protocol, inputs)
        for name in CONTEXT_METRICS:
            values = per_example_from_store(store, run.key, name, spec.protocol.hash(), ids).values
            assert np.allclose(values, again[name].per_example.values, equal_nan=True), name
        summary = result.groups["grad_x_input"].summaries["lds"]
        values = again["lds"].per_example.values
        assert (summary.value, summary.low, summary.high) == pytest.approx(bootstrap_mean(values[np.isfinite(values)]))
    text = markdown(result)
    assert "## 95 % bootstrap intervals over examples" in text and "source_comprehensiveness per number of removed sources" in text
    assert "lds: intervals that overlap" in text
    rerun = run_bench(spec, progress=False)
    assert rerun.computed == {"explanations": 0, "measurements": 0, "metrics": 0}


def test_bench_on_the_planted_set_counts_with_the_model_tokenizer(tiny, tmp_path):
    from heedful.evaluate.bench import dataset_options

    lm = tiny("llama", "causal_lm")
    spec = _spec(lm, "planted", tmp_path, dataset_options={"length": 400})
    options = dataset_options(spec)
    assert options["tokenizer"] is lm.adapter.tokenizer and options["length"] == 400
    from heedful.evaluate.bench import spec_subject

    assert spec_subject(spec, Dataset("planted", "test", [])).dataset == "planted[length=400]"


def test_context_metrics_need_sources(tiny, tmp_path):
    lm = tiny("llama", "causal_lm")
    spec = _spec(lm, "agreement", tmp_path / "out", metrics=["lds"], n=2, dataset_options={"causal": True})
    with pytest.raises(HeedfulError, match="agreement has no sources, so context metrics are undefined"):
        run_bench(spec, progress=False)
    with pytest.raises(HeedfulError, match="no example of .* is usable"):  # context data needs a causal LM
        run_bench(_spec(tiny("bert"), _context_file(tmp_path / "c.jsonl"), tmp_path / "o2"), progress=False)


def test_span_targets_and_a_one_position_method_fail_before_any_work(lm, context_file, tmp_path):
    with pytest.raises(InputError, match="target of several tokens .* which random cannot explain"):
        run_bench(_spec(lm, context_file, tmp_path / "out", methods=["saliency", "random"]), progress=False)
    assert not (tmp_path / "out" / "results.sqlite").exists()  # refused before the store was opened


def test_ablations_need_sources(lm):
    expl = lm.explain("It rained. We sat in.", "saliency")
    with pytest.raises(InputError, match="explanation 0 has no sources"):
        measure_ablations(lm.adapter, [expl], get_protocol("default"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source_ks": (3, 1)}, "source_ks must be increasing numbers of sources from 1"),
        ({"source_ks": (0, 1)}, "source_ks must be increasing"),
        ({"lds_keep": 1.0}, "lds_keep must lie strictly between 0 and 1"),
        ({"lds_ablations": 2}, "lds_ablations must be at least 3"),
        ({"precision_k": 0}, "precision_k must be at least 1"),
    ],
)
def test_bad_context_protocol_fields(changes, message):
    with pytest.raises(InputError, match=message):
        Protocol(**changes)


def test_later_fields_keep_older_protocol_hashes():
    protocol = get_protocol("mask-lrp")
    assert not set(LATER_FIELDS) & set(protocol.key_dict())
    assert protocol.hash() == "76d85f4d64b0fc2a"  # the hash stores were written under before these fields
    assert protocol.with_(lds_ablations=64).hash() != protocol.hash()
    assert protocol.with_(lds_ablations=64).key_dict()["lds_ablations"] == 64


def test_bench_cli_on_context_data(monkeypatch, capsys, tmp_path, context_file):
    folder = saved_tiny(tmp_path / "tiny-llama", "llama", "causal_lm")
    code, out, err = run_cli(
        monkeypatch, capsys, "bench", "--model", folder, "--dataset", context_file, "--methods", "saliency",
        "--metrics", "source_top1,lds", "--option", "protocol.lds_ablations=4", "--out", str(tmp_path / "out"),
    )
    assert code == 0, err
    report = next((tmp_path / "out").glob("*.md")).read_text(encoding="utf-8")
    assert "| saliency |" in report and "95 % bootstrap intervals" in report
