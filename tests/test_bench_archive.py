"""``heedful bench dump`` / ``load``: a results folder written as text and loaded elsewhere holds
the same rows in every table, its other files, and leaves the bench nothing to compute; a dump
is deterministic, a grown store dumps to its old lines plus new ones, and a clashing or edited
archive is refused with one line."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import REVIEWS, run_cli, write_reviews

from heedful.errors import HeedfulError
from heedful.evaluate import get_protocol
from heedful.evaluate.archive import DUMP_NAME, dump_folder, load_archive, shard_name
from heedful.evaluate.bench import BenchSpec, run_bench
from heedful.evaluate.merge import merge_stores

TABLES = ("info", "runs", "explanations", "measurements", "metrics", "costs", "protocols")


def _spec(model, data_csv, out, methods, n=None) -> BenchSpec:
    return BenchSpec(
        model=model, dataset=data_csv, methods=methods, metrics=["aopc"], n=n,
        protocol=get_protocol("normxlogit", random_seeds=2), out=out, batch_size=2, model_label="tiny-bert",
    )


def _dumps(folder: Path) -> list[Path]:
    """The dump files of the store dumped into ``folder``: ``results.sqlite.jsonl`` and its shards."""
    return sorted(p for p in folder.iterdir() if p.name.startswith("results.sqlite.") and p.suffix == ".jsonl")


def _lines(folder: Path) -> list[str]:
    return [line for p in _dumps(folder) for line in p.read_text(encoding="utf-8").splitlines()]


def _tables(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table, in a fixed order (SQL, independent of the archive's code)."""
    with sqlite3.connect(path) as db:
        return {t: sorted(db.execute(f"SELECT * FROM {t}"), key=repr) for t in TABLES}


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory):
    """A results folder as heedful reproduce leaves one: a store, a nested store, and other files."""
    model = tiny("bert")
    root = tmp_path_factory.mktemp("archive")
    data = write_reviews(root / "data.csv", REVIEWS[:5])
    results = root / "results"
    run_bench(_spec(model, data, results, ["grad_x_input"]), progress=False)
    run_bench(_spec(model, data, results / "stability", ["random"], n=3), progress=False)
    np.savez(results / "stability" / "unit-0.npz", scores=np.arange(6.0))
    (results / "report-timings.json").write_text('{"bench": 12.5}', encoding="utf-8")
    (results / "unit-1.tmp.npz").write_bytes(b"a partial write")
    return model, data, results


def test_a_dumped_folder_loads_elsewhere_with_every_row_and_file(folder, tmp_path):
    model, data, results = folder
    dumped = dump_folder(results, tmp_path / "archive")
    assert (dumped.stores, dumped.files, dumped.kept) == (2, 2, 0)
    files = sorted(p.relative_to(tmp_path / "archive").as_posix() for p in (tmp_path / "archive").rglob("*") if p.is_file())
    assert [f for f in files if not f.endswith(".jsonl")] == ["report-timings.json", "stability/unit-0.npz"]
    assert {DUMP_NAME, f"stability/{DUMP_NAME}"} <= set(files)
    loaded = load_archive(tmp_path / "archive", tmp_path / "elsewhere")
    assert (loaded.stores, loaded.files) == (2, 2)
    for rel in ("results.sqlite", "stability/results.sqlite"):
        assert _tables(tmp_path / "elsewhere" / rel) == _tables(results / rel)
    lines = _lines(tmp_path / "archive") + _lines(tmp_path / "archive" / "stability")
    assert dumped.rows + dumped.bookkeeping == len(lines)
    assert loaded.rows == sum(any(f'"table": "{t}"' in line for t in ("explanations", "measurements", "metrics")) for line in lines)
    np.testing.assert_array_equal(np.load(tmp_path / "elsewhere" / "stability" / "unit-0.npz")["scores"], np.arange(6.0))
    again = run_bench(_spec(model, data, tmp_path / "elsewhere", ["grad_x_input"]), progress=False)
    assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0}


def test_loading_twice_adds_nothing_and_keeps_the_folders_own_files(folder, tmp_path):
    _, _, results = folder
    dump_folder(results, tmp_path / "archive")
    load_archive(tmp_path / "archive", tmp_path / "here")
    (tmp_path / "here" / "report-timings.json").write_text('{"bench": 30.0}', encoding="utf-8")
    second = load_archive(tmp_path / "archive", tmp_path / "here")
    assert (second.stores, second.rows, second.files, second.kept) == (2, 0, 0, 1)
    assert (tmp_path / "here" / "report-timings.json").read_text(encoding="utf-8") == '{"bench": 30.0}'
    assert "1 kept (the destination's differ)" in second.line("loaded", tmp_path / "archive", tmp_path / "here")


def test_a_dump_is_deterministic_and_a_grown_store_only_adds_lines(folder, tmp_path):
    model, data, results = folder
    first = dump_folder(results / "stability", tmp_path / "one")
    dump_folder(results / "stability", tmp_path / "two")
    assert [p.read_bytes() for p in _dumps(tmp_path / "one")] == [p.read_bytes() for p in _dumps(tmp_path / "two")]

    grown = tmp_path / "grown"
    shutil.copytree(results / "stability", grown)
    run_bench(_spec(model, data, grown, ["random"], n=5), progress=False)
    assert dump_folder(grown, tmp_path / "three").rows > first.rows
    old = _lines(tmp_path / "one")
    new = set(_lines(tmp_path / "three"))
    gone = [line for line in old if line not in new]
    assert gone and all(line.startswith('{"row": {"backward"') and '"table": "costs"' in line for line in gone)  # a run's cost grows


def test_a_clashing_archive_is_refused_and_merges_nothing(folder, tmp_path):
    _, _, results = folder
    dump_folder(results, tmp_path / "archive")
    here = tmp_path / "here"
    merge_stores(here, [results])
    with sqlite3.connect(here / "results.sqlite") as db:
        db.execute("UPDATE metrics SET value = value + 0.5 WHERE example_id = (SELECT MIN(example_id) FROM metrics)")
    before = _tables(here / "results.sqlite")
    with pytest.raises(HeedfulError, match=r"metrics row \(run .* differs from the one already merged"):
        load_archive(tmp_path / "archive", here)
    assert _tables(here / "results.sqlite") == before


def test_dump_and_load_commands_and_their_bad_input(folder, tmp_path, monkeypatch, capsys):
    _, _, results = folder
    code, _, err = run_cli(monkeypatch, capsys, "bench", "dump", str(results), str(tmp_path / "archive"))
    assert code == 0 and "2 stores" in err and "2 files copied" in err, err
    code, _, err = run_cli(monkeypatch, capsys, "bench", "load", str(tmp_path / "archive"), str(tmp_path / "here"))
    assert code == 0 and "loaded" in err, err
    assert _tables(tmp_path / "here" / "results.sqlite") == _tables(results / "results.sqlite")

    code, _, err = run_cli(monkeypatch, capsys, "bench", "dump", str(tmp_path / "nowhere"), str(tmp_path / "x"))
    assert code == 2 and "no results folder at" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "bench", "dump", str(tmp_path / "here"), str(tmp_path / "here" / "archive"))
    assert code == 2 and "overlap" in err and not (tmp_path / "here" / "archive").exists()
    shard = max(_dumps(tmp_path / "archive"), key=lambda p: len(p.read_text(encoding="utf-8").splitlines()))
    text = shard.read_text(encoding="utf-8")
    lines = text.splitlines()
    shard.write_text("\n".join([*lines[:3], lines[3].replace('"table": "', '"table": "x'), *lines[4:]]) + "\n", encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "load", str(tmp_path / "archive"), str(tmp_path / "there"))
    assert code == 2 and f"{shard.name}, line 4: not a row of a results store dump" in err and "Traceback" not in err
    shard.write_text(text, encoding="utf-8")
    head = tmp_path / "archive" / DUMP_NAME
    head.write_text(head.read_text(encoding="utf-8").replace('"key": "schema", "value": "2"', '"key": "schema", "value": "9"'), encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "load", str(tmp_path / "archive"), str(tmp_path / "there"))
    assert code == 2 and "is not a results store of schema 2 (found 9)" in err, err


def test_dump_and_load_count_the_same_rows_and_say_what_they_count(folder, tmp_path, monkeypatch, capsys):
    _, _, results = folder
    dumped = dump_folder(results, tmp_path / "archive")
    loaded = load_archive(tmp_path / "archive", tmp_path / "elsewhere")
    assert dumped.rows == loaded.rows > 0 and dumped.tables == loaded.tables and loaded.present == 0
    with sqlite3.connect(results / "results.sqlite") as db:
        own = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("explanations", "measurements", "metrics")}
    with sqlite3.connect(results / "stability" / "results.sqlite") as db:
        nested = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in own}
    assert dumped.tables == {t: own[t] + nested[t] for t in own}
    code, _, dump_line = run_cli(monkeypatch, capsys, "bench", "dump", str(results), str(tmp_path / "again"))
    code, _, load_line = run_cli(monkeypatch, capsys, "bench", "load", str(tmp_path / "again"), str(tmp_path / "there"))
    said = f"{dumped.rows} result rows"
    assert said in dump_line and f"{said} added" in load_line and "0 already present" in load_line, (dump_line, load_line)
    assert f"{dumped.tables['explanations']} explanations" in dump_line and f"{dumped.bookkeeping} rows of runs" in dump_line


def test_a_dump_shards_rows_by_their_runs_key_removes_stale_shards_and_loads_a_one_file_archive(folder, tmp_path):
    _, _, results = folder
    dumped = dump_folder(results, tmp_path / "archive")
    shards = _dumps(tmp_path / "archive")
    assert len(shards) >= 2 and dumped.largest == max(p.stat().st_size for p in shards + _dumps(tmp_path / "archive" / "stability"))
    for path in shards:
        for line in path.read_text(encoding="utf-8").splitlines():
            run = json.loads(line)["row"].get("run")
            assert path.name == (DUMP_NAME if run is None else f"results.sqlite.{run[0]}.jsonl") == shard_name(run)

    one_file = tmp_path / "one-file"  # every row in results.sqlite.jsonl, as dumps were before the shards
    one_file.mkdir()
    (one_file / DUMP_NAME).write_text("".join(p.read_text(encoding="utf-8") for p in shards), encoding="utf-8")
    load_archive(one_file, tmp_path / "from-one-file")
    assert _tables(tmp_path / "from-one-file" / "results.sqlite") == _tables(results / "results.sqlite")

    stale = tmp_path / "archive" / "results.sqlite.f.jsonl"
    if stale in shards:  # a run of this store lives there: pick a digit no run starts with
        stale = next(tmp_path / "archive" / shard_name(c) for c in "0123456789abcdef" if tmp_path / "archive" / shard_name(c) not in shards)
    stale.write_text(shards[0].read_text(encoding="utf-8"), encoding="utf-8")
    dump_folder(results, tmp_path / "archive")
    assert _dumps(tmp_path / "archive") == shards
