"""``heedful bench merge``: stores of one bench computed in shards merge into the store the whole
bench writes; rows present twice must agree; a merged store serves the bench with nothing left
to compute."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import run_cli, write_reviews

from heedful.errors import HeedfulError
from heedful.evaluate import get_protocol
from heedful.evaluate.bench import BenchSpec, run_bench
from heedful.evaluate.merge import merge_stores


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> str:
    return write_reviews(tmp_path_factory.mktemp("data") / "merge.csv")


def _spec(model, data_csv, out, methods, n=None) -> BenchSpec:
    return BenchSpec(
        model=model, dataset=data_csv, methods=methods, metrics=["aopc", "sufficiency"], n=n,
        protocol=get_protocol("normxlogit", random_seeds=2), out=out, batch_size=2, model_label="tiny-bert",
    )


def _rows(path: Path) -> dict[str, set[tuple]]:
    with sqlite3.connect(path) as db:
        return {
            "explanations": set(db.execute("SELECT run, example_id, json_remove(explanation, '$.cost.seconds') FROM explanations")),
            "measurements": set(db.execute("SELECT run, example_id, source, protocol_hash, data FROM measurements")),
            "metrics": set(db.execute("SELECT run, example_id, metric, protocol_hash, value, curve, extra FROM metrics")),
            "protocols": set(db.execute("SELECT * FROM protocols")),
            "runs": set(db.execute("SELECT run FROM runs")),
        }


def _costs(path: Path) -> dict[str, tuple[int, float]]:
    with sqlite3.connect(path) as db:
        return {run: (examples, forward) for run, examples, forward in db.execute("SELECT run, examples, forward FROM costs")}


@pytest.fixture(scope="module")
def shards(tiny, data_csv, tmp_path_factory):
    """The whole bench in one store, and the same bench in three shards: by method, and the
    random baseline split by examples (the first 4, then all 6: 4 rows in both shards)."""
    model = tiny("bert")
    root = tmp_path_factory.mktemp("shards")
    whole = run_bench(_spec(model, data_csv, root / "whole", ["grad_x_input", "random"]), progress=False)
    run_bench(_spec(model, data_csv, root / "a", ["grad_x_input"]), progress=False)
    run_bench(_spec(model, data_csv, root / "b", ["random"], n=4), progress=False)
    run_bench(_spec(model, data_csv, root / "c", ["random"]), progress=False)
    return model, root, whole


def test_shards_merge_into_the_whole_bench(shards, data_csv, tmp_path):
    model, root, whole = shards
    report = merge_stores(tmp_path / "merged", [root / "a", root / "b", root / "c" / "results.sqlite"])
    merged = tmp_path / "merged" / "results.sqlite"
    assert report.path == merged and report.stores == 3
    assert _rows(merged) == _rows(whole.store_path)
    # costs add up the work of every store that brought explanations (the overlap counts twice)
    costs, whole_costs = _costs(merged), _costs(whole.store_path)
    assert costs.keys() == whole_costs.keys()
    assert sorted(c[0] for c in costs.values()) == [6, 10, 10]
    assert report.added == {"explanations": 3 * 6, "measurements": 2 * 3 * 6, "metrics": 2 * 3 * 6}
    assert report.present == {"explanations": 2 * 4, "measurements": 2 * 2 * 4, "metrics": 2 * 2 * 4}
    assert "merged 3 stores into" in report.line() and "(40 rows already present)" in report.line()
    again = run_bench(_spec(model, data_csv, tmp_path / "merged", ["grad_x_input", "random"]), progress=False)
    assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0}
    for group in ("grad_x_input", "random"):
        assert again.groups[group].summaries["aopc"].value == whole.groups[group].summaries["aopc"].value


def test_a_differing_row_stops_the_merge_of_that_store(shards, tmp_path):
    _, root, _ = shards
    bad = tmp_path / "bad"
    shutil.copytree(root / "c", bad)
    with sqlite3.connect(bad / "results.sqlite") as db:
        db.execute("UPDATE metrics SET value = value + 0.5 WHERE example_id = (SELECT MIN(example_id) FROM metrics)")
    merge_stores(tmp_path / "merged", [root / "b"])
    before = _rows(tmp_path / "merged" / "results.sqlite")
    with pytest.raises(HeedfulError, match=r"bad/results.sqlite: metrics row \(run .* differs from the one already merged"):
        merge_stores(tmp_path / "merged", [bad])
    assert _rows(tmp_path / "merged" / "results.sqlite") == before  # nothing of the bad store


def test_merge_command(shards, tmp_path, monkeypatch, capsys):
    _, root, whole = shards
    out = tmp_path / "merged"
    code, _, err = run_cli(monkeypatch, capsys, "bench", "merge", str(out), str(root / "a"), str(root / "c"))
    assert code == 0, err
    assert "merged 2 stores into" in err and "18 explanations" in err
    assert _rows(out / "results.sqlite") == _rows(whole.store_path)
    code, _, err = run_cli(monkeypatch, capsys, "bench", "merge", str(out), str(tmp_path / "nowhere"))
    assert code == 2 and "no results store at" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "bench", "merge", str(out), str(out))
    assert code == 2 and "is the merged store itself" in err


def test_explanations_stored_before_raw_tokens_merge_with_later_ones(shards, tmp_path):
    """A store written before explanations kept ``raw_tokens`` apart (its ``tokens`` the raw
    symbols) merges with one written after: the same rows, not a clash."""
    import json

    _, root, _ = shards
    old = tmp_path / "old"
    shutil.copytree(root / "a", old)
    with sqlite3.connect(old / "results.sqlite") as db:
        for run, ident, text in db.execute("SELECT run, example_id, explanation FROM explanations").fetchall():
            data = json.loads(text)
            data["tokens"] = data.pop("raw_tokens")
            db.execute("UPDATE explanations SET explanation = ? WHERE run = ? AND example_id = ?", (json.dumps(data), run, ident))
    merge_stores(tmp_path / "merged", [root / "a"])
    report = merge_stores(tmp_path / "merged", [old])
    assert report.present["explanations"] == 6 and report.added["explanations"] == 0
