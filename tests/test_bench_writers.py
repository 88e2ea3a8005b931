"""Several writers of one results store, and local benches stopped mid-run: two ``heedful bench``
processes on one ``--out`` (same methods, and overlapping ones) share the work, store every row
once and print the table of a single run; a bench killed (SIGKILL) while it holds the store's
write lock resumes with the same command with nothing lost; Ctrl-C (SIGINT) keeps every finished
model batch, says what it kept and exits 130, and the same command completes the bench."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli, saved_tiny, write_reviews

import heedful
from heedful.evaluate import get_protocol
from heedful.evaluate.bench import BenchSpec, run_bench
from heedful.threads import torch_threads

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["charming", "dull", "moving", "predictable", "wonderful", "talented", "long", "funny"]
SENTENCES = [f"the {a} film was {b} and {c}" for a in WORDS[:4] for b in WORDS[4:] for c in ("odd", "fine")][:24]
METRICS = ["aopc", "sufficiency"]
IG_STEPS = 32
ALL = ["random", "grad_x_input", "integrated_gradients"]
RUNS = 4  # random x 2 seeds, grad_x_input, integrated_gradients
BOUND = 240  # seconds: a bound for a broken run only


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> str:
    return write_reviews(tmp_path_factory.mktemp("data") / "sentences.csv", SENTENCES)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert", "classification", initializer_range=0.2)


def _args(model_dir: str, data_csv: str, out: Path, methods: list[str], ig_steps: int = IG_STEPS, n: int = 24) -> list[str]:
    return [
        "bench", "--model", model_dir, "--dataset", data_csv, "--methods", ",".join(methods), "--metrics", ",".join(METRICS),
        "--preset", "normxlogit", "--random-seeds", "2", "--batch-size", "4", "--threads", "1", "--out", str(out), "--n", str(n),
        *(["--option", f"integrated_gradients.n_steps={ig_steps}"] if "integrated_gradients" in methods else []),
    ]


def _reference(model_dir: str, data_csv: str, out: Path, methods: list[str], ig_steps: int = IG_STEPS, n: int = 24) -> dict[str, list[tuple]]:
    """The rows of one uninterrupted bench in this process (one torch thread, like the commands)."""
    model = heedful.load(model_dir, progress=False)
    spec = BenchSpec(
        model=model, dataset=data_csv, methods=methods, metrics=METRICS, protocol=get_protocol("normxlogit", random_seeds=2),
        out=out, batch_size=4, n=n, method_options={"integrated_gradients": {"n_steps": ig_steps}},
    )
    with torch_threads(1):
        result = run_bench(spec, progress=False)
    return _rows(result.store_path)


@pytest.fixture(scope="module")
def reference(model_dir, data_csv, tmp_path_factory) -> dict[str, list[tuple]]:
    return _reference(model_dir, data_csv, tmp_path_factory.mktemp("single"), ALL)


def _rows(store: Path) -> dict[str, list[tuple]]:
    """Every stored result row without write times (nor an explanation's wall seconds), and the
    examples each cost record counts."""
    with sqlite3.connect(store) as db:
        return {
            "explanations": db.execute("SELECT run, example_id, json_remove(explanation, '$.cost.seconds') FROM explanations ORDER BY 1, 2").fetchall(),
            "measurements": db.execute("SELECT run, example_id, source, data FROM measurements ORDER BY 1, 2, 3").fetchall(),
            "metrics": db.execute("SELECT run, example_id, metric, value, curve, extra FROM metrics ORDER BY 1, 2, 3").fetchall(),
            "costs": db.execute("SELECT run, examples, forward, backward FROM costs ORDER BY 1").fetchall(),
        }


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen, Path, Path]:
    """``heedful ARGS`` as a process of its own; its stdout and stderr go to files beside ``log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    with open(out, "wb") as o, open(err, "wb") as e:
        return subprocess.Popen([sys.executable, "-m", "heedful", *args], env=env, stdout=o, stderr=e), out, err


def _explained(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(store, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM explanations").fetchone()[0]
    except sqlite3.OperationalError:  # the store exists, its tables not yet
        return 0


def _wait_for(process: subprocess.Popen, store: Path, explained: int) -> None:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline and process.poll() is None and _explained(store) < explained:
        time.sleep(0.01)
    assert process.poll() is None, "the bench ended before it could be stopped"


def _computed(err: str) -> dict[str, int]:
    found = re.search(r"computed this run: (\d+) explanations, (\d+) curve records, (\d+) metric values", err)
    assert found, err[-2000:]
    return dict(zip(("explanations", "measurements", "metrics"), map(int, found.groups()), strict=True))


def _table(out: str) -> list[str]:
    timing = re.compile(r"second|s / example|peak|MB")  # wall time and memory per example differ from run to run
    return [line for line in out.splitlines() if not timing.search(line)]


def _whole_steps(rows: dict[str, list[tuple]]) -> set[tuple[str, str]]:
    """The (run, example) pairs evaluated, after checking each was stored whole: both curves and
    every metric value, and an explanation."""
    evaluated = {(r[0], r[1]) for r in rows["metrics"]}
    assert len(rows["metrics"]) == len(evaluated) * len(METRICS)
    assert {(r[0], r[1]) for r in rows["measurements"]} == evaluated and len(rows["measurements"]) == 2 * len(evaluated)
    assert evaluated <= {(r[0], r[1]) for r in rows["explanations"]}
    return evaluated


@pytest.mark.parametrize(
    "methods",
    [
        # two processes on the same methods: the overlapping case covers the same claims on fewer rows
        pytest.param((ALL, ALL), id="same", marks=pytest.mark.slow),
        pytest.param((["random", "grad_x_input"], ["grad_x_input", "integrated_gradients"]), id="overlapping"),
    ],
)
def test_two_benches_on_one_store_write_every_row_once(model_dir, data_csv, reference, tmp_path, methods):
    out = tmp_path / "out"
    started = time.monotonic()
    runs = [_start(_args(model_dir, data_csv, out, m), tmp_path / f"bench{k}") for k, m in enumerate(methods)]
    for process, _, _ in runs:
        process.wait(timeout=BOUND)
    seconds = time.monotonic() - started
    logs = [(process.returncode, o.read_text(), e.read_text()) for process, o, e in runs]
    for code, _, err in logs:
        assert code == 0 and "Traceback" not in err and "locked" not in err, err[-2000:]
    assert _rows(out / "results.sqlite") == reference  # every row once, as one run stores it (cost records included)
    computed = [_computed(err) for _, _, err in logs]
    total = {t: sum(c[t] for c in computed) for t in computed[0]}
    assert total == {"explanations": 24 * RUNS, "measurements": 2 * 24 * RUNS, "metrics": 24 * RUNS * len(METRICS)}  # no work done twice
    print(f"{methods}: {seconds:.1f} s, explanations computed by each bench: {[c['explanations'] for c in computed]}")
    if methods[0] == methods[1]:
        assert _table(logs[0][1]) == _table(logs[1][1]) and "integrated_gradients" in logs[0][1]


def test_bench_killed_while_writing_resumes_with_nothing_lost(model_dir, data_csv, reference, tmp_path, monkeypatch, capsys):
    args = _args(model_dir, data_csv, tmp_path, ALL)
    store = tmp_path / "results.sqlite"
    process, _, err = _start(args, tmp_path / "killed")
    _wait_for(process, store, 8)
    probe = sqlite3.connect(store, timeout=0, isolation_level=None)
    deadline = time.monotonic() + BOUND
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
            except sqlite3.OperationalError:  # the bench holds the write lock: it is inside a transaction
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        probe.close()
    assert process.wait(timeout=BOUND) == -signal.SIGKILL, err.read_text()[-2000:]
    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
    before = _rows(store)
    evaluated = _whole_steps(before)
    assert len(before["explanations"]) < 24 * RUNS
    with torch_threads(None):  # --threads sets the count for the CLI's process: the test's own comes back after
        code, _, text = run_cli(monkeypatch, capsys, *args)
    assert code == 0, text
    assert _rows(store) == reference
    computed = _computed(text)
    assert computed["explanations"] == 24 * RUNS - len(before["explanations"])
    assert computed["metrics"] == (24 * RUNS - len(evaluated)) * len(METRICS)


def test_ctrl_c_keeps_the_finished_batches_and_the_same_command_resumes(model_dir, data_csv, tmp_path, monkeypatch, capsys):
    methods, steps, n = ["integrated_gradients"], 300, 12  # long enough batches to stop it midway
    args = _args(model_dir, data_csv, tmp_path, methods, steps, n)
    store = tmp_path / "results.sqlite"
    process, _, err = _start(args, tmp_path / "stopped")
    _wait_for(process, store, 4)  # a model batch stored
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=BOUND) == 130
    text = err.read_text()
    assert "Traceback" not in text, text[-2000:]
    kept = _rows(store)
    done, explained = len(_whole_steps(kept)), len(kept["explanations"])
    assert 4 <= explained < n  # stored batch by batch, not per task (one task of 12 here)
    shown = f"interrupted: kept {done} of {n} examples of integrated_gradients" + (f" ({explained} explained)" if explained > done else "")
    assert shown + f"; this run stored {explained} explanations and {done * len(METRICS)} metric values; run the same command to resume" in text, text[-2000:]
    with torch_threads(None):  # --threads sets the count for the CLI's process: the test's own comes back after
        code, _, resumed = run_cli(monkeypatch, capsys, *args)
    assert code == 0, resumed
    assert _computed(resumed) == {"explanations": n - explained, "measurements": 2 * (n - done), "metrics": len(METRICS) * (n - done)}
    assert _rows(store) == _reference(model_dir, data_csv, tmp_path / "single", methods, steps, n)


def test_a_row_written_twice_is_kept_once_and_compared(tmp_path, tiny):
    from heedful.evaluate import ResultsStore
    from heedful.evaluate.store import Subject, run_key
    from heedful.fingerprint import model_fingerprint

    model = tiny("bert")
    expl = model.explain("a charming and often affecting journey", "saliency")
    again = model.explain("a charming and often affecting journey", "saliency")  # other wall seconds, same row
    other = model.explain("the movie was dull and far too long", "saliency")
    key = run_key(Subject("m", model_fingerprint(model), "d", "0" * 16, "test"), "saliency")
    with ResultsStore(tmp_path) as first, ResultsStore(tmp_path) as second:
        first.record_explained(key, [("x1", expl)], seconds=2.0, peak_mb=10.0)
        second.record_explained(key, [("x1", again), ("x2", other)], seconds=4.0, peak_mb=20.0)
        assert second.written["explanations"] == 1 and second.differing["explanations"] == 0
        # the cost record counts each example once: the second writer adds its share of x2 only
        assert first.cost(key)["examples"] == 2 and first.cost(key)["seconds"] == pytest.approx(4.0)
        second.put_explanations(key, [("x1", other)])  # a different row under a stored key: kept as stored, counted
        assert second.differing["explanations"] == 1 and second.written["explanations"] == 1
        assert first.get_explanations(key, ["x1"])["x1"].text == expl.text
        first.put_metrics(key, "aopc", "p" * 16, [("x1", 0.5, None, None)])
        second.put_metrics(key, "aopc", "p" * 16, [("x1", 0.5, None, None), ("x2", 0.25, None, None)])
        assert second.written["metrics"] == 1 and second.differing["metrics"] == 0


def test_a_task_claimed_by_a_live_process_is_left_to_it(tmp_path):
    from heedful.evaluate import ResultsStore

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ResultsStore(tmp_path) as store:
            with store.transaction():
                store.db.execute("INSERT INTO claims VALUES ('run', 'e1', ?, ?, ?)", (holder.pid, socket.gethostname(), time.time()))
            assert not store.claim("run", "e1")  # the holder runs
            holder.kill()
            holder.wait()
            assert store.claim("run", "e1")  # the holder is gone: taken over
            assert store.db.execute("SELECT pid FROM claims").fetchall() == [(os.getpid(),)]
            store.release("run", "e1")
            assert store.db.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)
    finally:
        holder.kill()
        holder.wait()
