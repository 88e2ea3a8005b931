"""``heedful bench --engine ray`` on a local Ray cluster: the same results as the local engine, a
worker killed mid-run retried with no row lost or written twice, a killed driver resumed by the
same command, and the command's table. One cluster (2 CPUs) serves the whole module."""

from __future__ import annotations

import os
import re
import signal
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
RUNS = 3  # random x 2 seeds + grad_x_input
METRICS = ["aopc", "sufficiency"]


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> str:
    return write_reviews(tmp_path_factory.mktemp("data") / "sentences.csv", SENTENCES)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert", "classification", initializer_range=0.2)


@pytest.fixture(scope="module")
def model(model_dir):
    return heedful.load(model_dir, progress=False)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for the module; yields its address (for other drivers)."""
    ray = pytest.importorskip("ray")
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": env},
        _system_config={"worker_register_timeout_seconds": 600},  # worker start-up on a loaded machine
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _spec(model, data_csv, out, **kw) -> BenchSpec:
    base = dict(
        model=model, dataset=data_csv, methods=["random", "grad_x_input"], metrics=METRICS,
        protocol=get_protocol("normxlogit", random_seeds=2), out=out, batch_size=2, chunk=4, model_label="tiny-bert",
    )
    base.update(kw)
    return BenchSpec(**base)


def _engine(model_dir, **kw):
    from heedful.evaluate.ray_engine import RayEngine

    return RayEngine(heedful.loading.loader(model_dir), 2, **kw)


def _rows(store: Path) -> dict[str, list[tuple]]:
    """Every stored result row, without write times (nor an explanation's wall seconds)."""
    with sqlite3.connect(store) as db:
        return {
            "explanations": db.execute("SELECT run, example_id, json_remove(explanation, '$.cost.seconds') FROM explanations ORDER BY 1, 2").fetchall(),
            "measurements": db.execute("SELECT run, example_id, source, data FROM measurements ORDER BY 1, 2, 3").fetchall(),
            "metrics": db.execute("SELECT run, example_id, metric, value, curve, extra FROM metrics ORDER BY 1, 2, 3").fetchall(),
        }


def _complete(n: int = len(SENTENCES)) -> dict[str, int]:
    return {"explanations": n * RUNS, "measurements": 2 * n * RUNS, "metrics": n * RUNS * len(METRICS)}  # remove + keep curves


@pytest.fixture(scope="module")
def local(model, data_csv, tmp_path_factory):
    """The local engine's results, with one torch thread like the workers (so equal bit for bit)."""
    with torch_threads(1):
        result = run_bench(_spec(model, data_csv, tmp_path_factory.mktemp("local")), progress=False)
    assert result.computed == _complete()
    return result, _rows(result.store_path)


@pytest.mark.slow  # a local Ray cluster (about 20 s to start) and a bench through it, 30-45 s each on 2 cores: run with -m slow
def test_ray_engine_equals_local_engine(cluster, model, model_dir, data_csv, local, tmp_path):
    result = run_bench(_spec(model, data_csv, tmp_path), progress=False, engine=_engine(model_dir))
    assert result.computed == _complete()
    assert _rows(result.store_path) == local[1]
    for group, got in result.groups.items():
        for name in METRICS:
            assert got.summaries[name].value == local[0].groups[group].summaries[name].value
    report = result.engine
    assert report.tasks == RUNS * len(SENTENCES) // 4 and report.retries == 0 and len(report.workers) == 2
    assert "ray engine: 18 tasks computed, 0 already stored, 0 retried" in report.lines()[0]
    again = run_bench(_spec(model, data_csv, tmp_path), progress=False, engine=_engine(model_dir))
    assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0} and again.engine.stored == 18


@pytest.mark.slow  # a local Ray cluster (about 20 s to start) and a bench through it, 30-45 s each on 2 cores: run with -m slow
def test_killed_worker_is_retried_and_nothing_is_lost_or_doubled(cluster, model, model_dir, data_csv, local, tmp_path):
    pids: list[int] = []
    killed: list[int] = []

    def kill_first(stage: str, n: int) -> None:
        if not killed:  # a task is stored: kill worker 0, which still has queued work
            killed.append(pids[0])
            os.kill(pids[0], signal.SIGKILL)

    result = run_bench(_spec(model, data_csv, tmp_path), progress=False, on_batch=kill_first, engine=_engine(model_dir, on_start=pids.extend))
    assert killed
    assert result.computed == _complete()  # every row written once
    assert _rows(result.store_path) == local[1]
    report = result.engine
    assert report.retries >= 1 and report.restarts >= 1
    assert report.tasks == 18 and f"{report.retries} retried" in report.lines()[0]


@pytest.mark.slow  # a second Ray driver process after a kill, about 15 s on 2 cores: run with -m slow
def test_killed_driver_resumes_with_the_same_command(cluster, model, model_dir, data_csv, local, tmp_path):
    args = [
        "bench", "--model", model_dir, "--dataset", data_csv, "--methods", "random,grad_x_input", "--metrics", "aopc,sufficiency",
        "--preset", "normxlogit", "--random-seeds", "2", "--batch-size", "1", "--out", str(tmp_path),
        "--engine", "ray", "--workers", "2", "--address", cluster,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-m", "heedful.cli", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = tmp_path / "results.sqlite"
    stored = 0
    deadline = time.monotonic() + 600  # a bound for a broken run only
    while time.monotonic() < deadline and driver.poll() is None:
        if store.exists():
            try:
                with sqlite3.connect(store, timeout=30) as db:
                    stored = db.execute("SELECT COUNT(*) FROM explanations").fetchone()[0]
            except sqlite3.OperationalError:  # the store exists, its tables not yet
                stored = 0
            if stored >= 8:  # two tasks of 4 examples written
                break
        time.sleep(0.02)
    assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    before = _rows(store)
    explained = {(r[0], r[1]) for r in before["explanations"]}
    total = _complete()["explanations"]
    assert 8 <= len(explained) < total
    # a task is stored whole or not at all: every explained example has its values, and no others
    assert {(r[0], r[1]) for r in before["metrics"]} == explained and len(before["metrics"]) == len(explained) * len(METRICS)
    resumed = run_bench(
        _spec(model, data_csv, tmp_path, batch_size=1, chunk=None, model_label=None), progress=False, engine=_engine(model_dir, address=cluster)
    )
    missing = total - len(explained)
    assert resumed.computed == {"explanations": missing, "measurements": 2 * missing, "metrics": missing * len(METRICS)}
    assert resumed.engine.tasks * 4 == missing and resumed.engine.stored * 4 == len(explained)
    assert len(_rows(store)["metrics"]) == total * len(METRICS)


@pytest.mark.slow  # a local Ray cluster (about 20 s to start) and a bench through it, 30-45 s each on 2 cores: run with -m slow
def test_command_prints_the_local_engines_table(cluster, model_dir, data_csv, tmp_path, monkeypatch, capsys):
    common = [
        "bench", "--model", model_dir, "--dataset", data_csv, "--methods", "random,grad_x_input", "--metrics", "aopc,sufficiency",
        "--preset", "normxlogit", "--random-seeds", "2", "--batch-size", "2", "--n", "8",
    ]
    with torch_threads(None):  # --threads sets the count for the CLI's process: the test's own comes back after
        # one torch thread on both sides (near-tied scores may order differently across thread counts)
        code, table, _ = run_cli(monkeypatch, capsys, *common, "--threads", "1", "--out", str(tmp_path / "local"))
        assert code == 0
        code, ray_table, err = run_cli(
            monkeypatch, capsys, *common, "--threads", "1", "--out", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"
        )
    assert code == 0, err
    timing = re.compile(r"second|s / example|peak|MB")  # wall time and memory per example differ from run to run
    assert [line for line in ray_table.splitlines() if not timing.search(line)] == [line for line in table.splitlines() if not timing.search(line)]
    assert "ray engine: 3 tasks computed" in err and "explanations/s" in err


def test_engine_errors_are_one_line(model_dir, data_csv, tmp_path, monkeypatch, capsys):
    common = ["bench", "--model", model_dir, "--dataset", data_csv, "--methods", "random", "--out", str(tmp_path)]
    code, _, err = run_cli(monkeypatch, capsys, *common, "--engine", "spark")
    assert code == 2 and "unknown engine 'spark'" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, *common, "--workers", "2")
    assert code == 2 and "--address and --workers need --engine ray" in err
    code, _, err = run_cli(monkeypatch, capsys, *common, "--engine", "ray", "--workers", "0")
    assert code == 2 and "--workers must be at least 1" in err and "Traceback" not in err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code, _, err = run_cli(monkeypatch, capsys, *common, "--engine", "ray")
    assert code == 2 and "pip install 'heedful[ray]'" in err and "Traceback" not in err
    assert not (tmp_path / "results.sqlite").exists()  # nothing was started


def test_a_worker_loader_is_picklable_and_finds_a_folder_from_any_directory(tmp_path, monkeypatch):
    import pickle

    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    by_folder = heedful.loading.loader("model", max_memory="1GB")
    assert by_folder.args == (str(tmp_path / "model"),) and by_folder.keywords == {"max_memory": "1GB", "progress": False}
    by_name = pickle.loads(pickle.dumps(heedful.loading.loader("minilm-sentiment")))
    assert by_name.func is heedful.load and by_name.args == ("minilm-sentiment",)
