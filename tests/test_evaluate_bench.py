"""The results store and ``heedful bench``: resume without recomputation, reuse of stored
explanations and curves by further metrics, and the command end to end on a tiny model."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from conftest import run_cli, saved_tiny

from heedful.evaluate import ResultsStore, get_protocol
from heedful.evaluate.bench import BenchSpec, run_bench
from heedful.evaluate.report import write_report
from heedful.evaluate.store import Subject, run_key
from heedful.fingerprint import model_fingerprint

ROWS = [
    ("a charming and often affecting journey", "POSITIVE", "charming|affecting"),
    ("the movie was dull and far too long", "NEGATIVE", "dull"),
    ("an intelligent , funny and moving film", "POSITIVE", "funny|moving"),
    ("what a waste of a talented cast", "NEGATIVE", "waste"),
    ("we watched it twice and loved every minute", "POSITIVE", "loved"),
]


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "tiny.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label", "evidence"])
        writer.writerows(ROWS)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert", "classification", initializer_range=0.2)


class Counting:
    """A model whose ``explain`` calls are counted."""

    def __init__(self, model):
        self.model, self.calls = model, 0
        original = model.explain

        def explain(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        model.explain = explain

    def restore(self):
        del self.model.explain


def _spec(model, data_csv, out, **kw) -> BenchSpec:
    base = dict(
        model=model, dataset=data_csv, methods=["random", "saliency"], metrics=["aopc", "sufficiency", "token_f1"],
        protocol=get_protocol("normxlogit", random_seeds=2), out=out, batch_size=2, model_label="tiny-bert",
    )
    base.update(kw)
    return BenchSpec(**base)


def test_store_round_trip(tmp_path, tiny):
    model = tiny("bert")
    expl = model.explain("a charming and often affecting journey", "saliency")
    key = run_key(Subject("m", model_fingerprint(model), "d", "0" * 16, "test"), "saliency")
    with ResultsStore(tmp_path) as store:
        store.put_explanations(key, [("x1", expl)])
        assert store.explanation_ids(key) == {"x1"}
        back = store.get_explanations(key)["x1"]
        assert back.tokens == expl.tokens and np.allclose(back.scores, expl.scores)
        assert store.explanation_costs(key) == {"x1": (expl.cost.forward_passes, expl.cost.backward_passes)}
        assert expl.cost.backward_passes == 1 and store.explanation_costs(key, ["x2"]) == {}
        store.put_metrics(key, "aopc", "p" * 16, [("x1", float("nan"), [0.1, float("nan")], {"gold": 1.0})])
        value, curve, extra = store.get_metrics(key, "aopc", "p" * 16)["x1"]
        assert math.isnan(value) and curve[0] == 0.1 and math.isnan(curve[1]) and extra == {"gold": 1.0}
        store.add_cost(key, 2, 1.0, 2.0, 0.0, 100.0)
        store.add_cost(key, 3, 2.0, 3.0, 0.0, 50.0)
        assert store.cost(key) == {"examples": 5, "seconds": 3.0, "forward": 5.0, "backward": 0.0, "peak_mb": 100.0}
        assert store.written == {"explanations": 1, "measurements": 0, "metrics": 1}


def test_resume_computes_nothing_twice(tiny, data_csv, tmp_path):
    model = tiny("bert")
    counter = Counting(model)
    try:
        first = run_bench(_spec(model, data_csv, tmp_path), progress=False)
        runs = 3  # random x 2 seeds + saliency
        assert first.n_examples == 5 and len(first.runs) == runs
        assert first.computed == {"explanations": 5 * runs, "measurements": 2 * 5 * runs, "metrics": 3 * 5 * runs}
        calls = counter.calls
        again = run_bench(_spec(model, data_csv, tmp_path), progress=False)
        assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0}
        assert counter.calls == calls  # no method ran
        for name in ("aopc", "sufficiency", "token_f1"):
            assert again.groups["saliency"].summaries[name].value == pytest.approx(first.groups["saliency"].summaries[name].value)
        assert first.groups["random"].seeds == 2 and np.isfinite(first.groups["random"].summaries["aopc"].std)
        # a further metric on the same curves: no explanation, no forward pass, only its values
        more = run_bench(_spec(model, data_csv, tmp_path, metrics=["aopc", "log_odds", "accuracy"]), progress=False)
        assert more.computed == {"explanations": 0, "measurements": 0, "metrics": 2 * 5 * runs}
        assert counter.calls == calls
    finally:
        counter.restore()


def test_interrupted_run_resumes_where_it_stopped(tiny, data_csv, tmp_path):
    from heedful.errors import Interrupted

    model = tiny("bert")
    seen = []

    def stop(stage, n):
        seen.append((stage, n))
        if stage == "evaluate":
            raise KeyboardInterrupt

    spec = _spec(model, data_csv, tmp_path, methods=["saliency"], batch_size=1)
    with pytest.raises(Interrupted) as info:
        run_bench(spec, progress=False, on_batch=stop)
    # the first task (4 examples) stored each model batch (of 1) as it came: four explained, one evaluated
    assert seen == [("explain", 1)] * 4 + [("evaluate", 1)]
    assert info.value.message == (
        "interrupted: kept 1 of 5 examples of saliency (4 explained); this run stored 4 explanations and 3 metric values;"
        " run the same command to resume"
    )
    resumed = run_bench(_spec(model, data_csv, tmp_path, methods=["saliency"], batch_size=1), progress=False)
    assert resumed.computed == {"explanations": 1, "measurements": 2 * 4, "metrics": 3 * 4}


def test_gold_label_protocol_explains_gold_class(tiny, data_csv, tmp_path):
    model = tiny("bert")
    spec = _spec(model, data_csv, tmp_path, methods=["saliency"], metrics=["aopc"],
                 protocol=get_protocol("mask-lrp", min_length=0))
    result = run_bench(spec, progress=False)
    key = result.runs[0].key
    with ResultsStore(tmp_path) as store:
        stored = store.get_explanations(key)
    labels = {t: lab for t, lab, _ in ROWS}
    assert {e.target.label for e in stored.values()} == {"POSITIVE", "NEGATIVE"}
    assert all(e.target.label == labels[e.text] for e in stored.values())
    files = write_report(result)
    assert {f.suffix for f in files} == {".md", ".csv", ".png"}
    assert "mask-lrp" in files[0].read_text()


def test_bench_command_end_to_end(monkeypatch, capsys, model_dir, data_csv, tmp_path):
    args = ["bench", "--model", model_dir, "--dataset", data_csv, "--methods", "random,grad_x_input",
            "--metrics", "aopc,accuracy,average_precision", "--preset", "normxlogit", "--n", "4",
            "--out", str(tmp_path), "--random-seeds", "2", "--batch-size", "2"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "aopc ↑" in out and "grad_x_input" in out and "±" in out and "s / example" in out
    assert "computed this run: 12 explanations" in err
    names = {p.name for p in tmp_path.iterdir()}
    stem = next(n for n in names if n.endswith(".md"))[:-3]
    assert stem.startswith("tiny-bert") and stem.endswith("__normxlogit")
    assert {f"{stem}.csv", f"{stem}_curves.csv", f"{stem}_aopc.png", f"{stem}_accuracy.png", "results.sqlite"} <= names
    assert (tmp_path / f"{stem}_aopc.png").stat().st_size > 10_000
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and "computed this run: 0 explanations, 0 curve records, 0 metric values" in err


def test_bench_command_errors(monkeypatch, capsys, model_dir, data_csv, tmp_path):
    base = ["bench", "--model", model_dir, "--dataset", data_csv, "--out", str(tmp_path)]
    code, _, err = run_cli(monkeypatch, capsys, *base, "--methods", "saliency", "--metrics", "aopc,nope")
    assert code == 2 and "unknown metric" in err and "hint" in err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--methods", "saliency,nope")
    assert code == 2 and "unknown method" in err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--methods", "saliency", "--metrics", "pearson")
    assert code == 2 and "regression" in err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--methods", "saliency", "--preset", "eraser")
    assert code == 2 and "preset" in err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--methods", "saliency", "--option", "bad")
    assert code == 2 and "target.key=value" in err
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--model", model_dir, "--out", str(tmp_path))
    assert code == 2 and "needs --dataset, --methods" in err and "hint" in err


def test_explaining_without_evaluating_stores_the_bench_tasks_explanations(tiny, data_csv, tmp_path):
    """Explanations stored without evaluation (the Mask-LRP report's sensitivity table) are the
    bench's: the same chunks, so a later bench evaluates them without explaining again."""
    from heedful.evaluate import bench

    model = tiny("bert")
    spec = _spec(model, data_csv, tmp_path, methods=["saliency"], metrics=["aopc"], batch_size=1, chunk=2)
    inputs, data = bench.select_inputs(model, spec, {})
    run = bench.make_runs(spec, bench.spec_subject(spec, data))[0]
    seen = []
    with ResultsStore(tmp_path) as store:
        with store.transaction():
            store.put_explanations(run.key, [(inputs[2].id, model.explain(inputs[2].text, "saliency"))])
        bench._explain_missing(model, store, run, inputs, spec, on_batch=lambda stage, n: seen.append(n))
        assert store.explanation_ids(run.key) == {i.id for i in inputs}
    assert seen == [1, 1, 1, 1]  # chunks {0, 1}, {2, 3} (2 stored), {4}: a transaction per model batch (of 1)
    counter = Counting(model)
    try:
        result = run_bench(spec, progress=False)
    finally:
        counter.restore()
    assert result.computed["explanations"] == 0 and counter.calls == 0
    assert result.computed["metrics"] == len(inputs)
