"""Columnar export of a results store: one row per example x method run x metric, in Parquet
(list columns) or CSV (lists as JSON strings), with a run manifest JSON beside the file.

The store (:mod:`heedful.evaluate.store`) is the source; the export is a flat, documented
table any analyst can open in pandas, DuckDB, R or a spreadsheet. :data:`COLUMNS` is its schema
(name, Arrow type, meaning), written into the manifest and into ``docs/bench.md``. An explanation
that no metric has been computed for yet is still exported, once, with empty metric columns, so
nothing stored is left out.

>>> export_store("results/", "results/bench.parquet")                      # doctest: +SKIP
Export(path=PosixPath('results/bench.parquet'), manifest=PosixPath('results/bench.manifest.json'), rows=1200)

pyarrow is imported only for Parquet (``pip install 'heedful[parquet]'``); CSV needs nothing
beyond the standard library.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from heedful.errors import HeedfulError, Hint, InputError, install_hint
from heedful.evaluate.store import FILE_NAME, ResultsStore, RunKey
from heedful.explanation import Explanation
from heedful.version import __version__

FORMATS = ("parquet", "csv")
MANIFEST_SUFFIX = ".manifest.json"
IMPORTED_OPTION = "file_sha256"
"""The option every imported run's key carries (:mod:`heedful.evaluate.bench_import`): the
SHA-256 of the file its explanations were read from."""

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run", "string", "digest of the run's store key (method, options, version, fingerprints, setting)"),
    ("model", "string", "the model's label: zoo name, folder path or hub id"),
    ("model_fingerprint", "string", "hash of the model's weights, config and tokenizer"),
    ("dataset", "string", "the dataset's label: name (with its options) or file path"),
    ("dataset_fingerprint", "string", "hash of the dataset split's content"),
    ("split", "string", "dataset split"),
    ("method", "string", "attribution method (an imported run: the name it was imported under)"),
    ("source", "string", "'heedful' (computed by heedful) or 'imported' (read from a file and aligned)"),
    ("method_version", "int64", "the method's version (an imported run: the import format's)"),
    ("options", "string", "the method's complete options as JSON (an imported run: the file's hash and format)"),
    ("seed", "int64", "seed of a stochastic method (null otherwise)"),
    ("precision", "string", "numeric precision the run's key records (null: fp32, the default)"),
    ("setting", "string", "explanation setting as JSON: label choice, max_length, language-model word"),
    ("example_id", "string", "example id in the dataset"),
    ("example_index", "int64", "position of the example in the order the run stored it (the dataset's order)"),
    ("text", "string", "the explained text"),
    ("text_pair", "string", "second segment (null for single texts)"),
    ("target", "string", "label of the explained output (class name or token)"),
    ("target_indices", "list<int64>", "output column(s) explained (one, or target and foil of a contrast)"),
    ("truncated", "bool", "whether the text was cut to max_length"),
    ("tokens", "list<string>", "the model's tokens as people read them (decoded; line breaks as ⏎, whitespace-only tokens as ␣), special tokens included"),
    ("raw_tokens", "list<string>", "the same tokens as the tokenizer's symbols (e.g. 'ĠParis'; an explanation stored before raw tokens were kept: equal to tokens)"),
    ("offsets", "list<list<int64>>", "character [start, end] of each token in text (or text_pair); null for special tokens"),
    ("special", "list<bool>", "whether each token is a special token"),
    ("scores", "list<double>", "one score per token (a layer-wise method: its last layer, the one the metrics rank)"),
    ("layer_scores", "list<list<double>>", "a layer-wise method's scores, layers 1..L (null otherwise)"),
    ("metric", "string", "metric name (null: no metric computed for this explanation yet)"),
    ("protocol", "string", "evaluation protocol (preset) name"),
    ("protocol_hash", "string", "hash of the protocol's fields (the manifest lists them)"),
    ("value", "double", "the metric's value for this example (null where it is undefined)"),
    ("curve", "list<double>", "the metric's per-ratio (or per-k) curve for this example (null for scalar metrics)"),
    ("extra", "string", "what else the metric recorded for this example, as JSON (null when nothing)"),
)
"""The export's schema: ``(name, Arrow type, meaning)`` of every column, in order."""


@dataclass(frozen=True)
class Export:
    """What :func:`export_store` wrote: the table, its manifest and the number of rows."""

    path: Path
    manifest: Path
    rows: int


# ---------------------------------------------------------------------------- paths
def manifest_path(path: str | Path) -> Path:
    """``bench.parquet`` -> ``bench.manifest.json`` (beside the table)."""
    path = Path(path)
    return path.with_name(path.stem + MANIFEST_SUFFIX) if path.suffix else path.with_name(path.name + MANIFEST_SUFFIX)


def open_store(path: str | Path) -> ResultsStore:
    """An existing results store (a ``--out`` folder or its ``.sqlite`` file), never a new one."""
    path = Path(path).expanduser()
    file = path if path.suffix in (".sqlite", ".db") else path / FILE_NAME
    if not file.is_file():
        raise InputError(f"no results store at {path}", hint="give the --out folder of a heedful bench run (it holds results.sqlite)")
    return ResultsStore(file)


def _table_path(out: str | Path, fmt: str) -> Path:
    out = Path(out).expanduser()
    if out.is_dir() or str(out).endswith(os.sep):
        return out / f"bench.{fmt}"
    return out if out.suffix else out.with_suffix(f".{fmt}")


def require_pyarrow():
    """``pyarrow`` (and ``pyarrow.parquet``), or a one-line error naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise HeedfulError(
            "Parquet needs pyarrow, which is not installed",
            hint=Hint(f"{install_hint('parquet')}, or pass format='csv'", f"{install_hint('parquet')}, or use --format csv"),
        ) from exc
    return pa, pq


# ---------------------------------------------------------------------------- rows
def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _floats(values: Any) -> list[float | None] | None:
    if values is None:
        return None
    return [_finite(float(v)) for v in np.asarray(values, dtype=float).reshape(-1)]


def stored_order(store: ResultsStore, key: RunKey) -> list[str]:
    """The run's example ids in the order they were stored (a bench stores them in the
    dataset's order; the rowid of SQLite's explanations table keeps it)."""
    rows = store.db.execute("SELECT example_id FROM explanations WHERE run=? ORDER BY rowid", (key.digest,))
    return [row[0] for row in rows]


def _explanation_columns(expl: Explanation) -> dict[str, Any]:
    layerwise = expl.scores.ndim == 2
    last = expl.scores[-1] if layerwise else expl.scores
    return {
        "text": expl.text,
        "text_pair": expl.text_pair,
        "target": expl.target.label,
        "target_indices": [int(i) for i in expl.target.indices],
        "truncated": bool(expl.truncated),
        "tokens": list(expl.tokens),
        "raw_tokens": list(expl.raw_tokens),
        "offsets": [None if o is None else [int(o[0]), int(o[1])] for o in expl.offsets],
        "special": [bool(s) for s in expl.special],
        "scores": _floats(last),
        "layer_scores": [_floats(layer) for layer in expl.scores] if layerwise else None,
    }


def run_columns(key: RunKey) -> dict[str, Any]:
    """The columns every row of ``key``'s run shares."""
    options = json.loads(key.options)
    setting = json.loads(key.setting)
    seed = options.get("seed")
    precision = options.get("precision", setting.get("precision"))
    return {
        "run": key.digest,
        "model": key.model,
        "model_fingerprint": key.model_fingerprint.digest,
        "dataset": key.dataset,
        "dataset_fingerprint": key.dataset_fingerprint,
        "split": key.split,
        "method": key.method,
        "source": "imported" if IMPORTED_OPTION in options else "heedful",
        "method_version": int(key.version),
        "options": key.options,
        "seed": int(seed) if isinstance(seed, int | float) and not isinstance(seed, bool) else None,
        "precision": None if precision is None else str(precision),
        "setting": key.setting,
    }


def distinct_runs(store: ResultsStore) -> list[RunKey]:
    """Every run key of ``store`` once (a run reached under two model labels is one run), oldest first."""
    found: dict[str, RunKey] = {}
    for key, _ in store.run_keys():
        found.setdefault(key.digest, key)
    return list(found.values())


def iter_rows(store: ResultsStore, keys: list[RunKey] | None = None) -> Iterator[list[dict[str, Any]]]:
    """The export's rows, one list per run (so a writer holds one run at a time)."""
    protocols: dict[str, str | None] = {}
    for key in keys if keys is not None else distinct_runs(store):
        order = stored_order(store, key)
        if not order:
            continue
        explanations = store.get_explanations(key)
        shared = run_columns(key)
        metrics = []
        for metric, phash, _count in store.metric_counts(key):
            if phash not in protocols:
                found = store.protocol(phash)
                protocols[phash] = None if found is None else found[0]
            metrics.append((metric, phash, store.get_metrics(key, metric, phash)))
        rows = []
        for index, ident in enumerate(order):
            expl = explanations[ident]
            base = {**shared, "example_id": ident, "example_index": index, **_explanation_columns(expl)}
            found = [(m, p, values[ident]) for m, p, values in metrics if ident in values]
            if not found:
                rows.append({**base, **dict.fromkeys(("metric", "protocol", "protocol_hash", "value", "curve", "extra"))})
            for metric, phash, (value, curve, extra) in found:
                rows.append({
                    **base,
                    "metric": metric,
                    "protocol": protocols[phash],
                    "protocol_hash": phash,
                    "value": _finite(float(value)),
                    "curve": _floats(curve),
                    "extra": None if extra is None else json.dumps({k: _jsonable(v) for k, v in extra.items()}),
                })
        yield rows


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------- writers
def arrow_schema(pa):
    """The export's schema as a ``pyarrow.Schema``."""
    scalar = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_(), "double": pa.float64()}

    def typed(name: str):
        if name.startswith("list<list<"):
            return pa.list_(pa.list_(scalar[name[10:-2]]))
        if name.startswith("list<"):
            return pa.list_(scalar[name[5:-1]])
        return scalar[name]

    return pa.schema([pa.field(name, typed(kind), nullable=True) for name, kind, _ in COLUMNS])


def _write_parquet(runs: Iterator[list[dict]], path: Path) -> int:
    pa, pq = require_pyarrow()
    schema = arrow_schema(pa)
    names = [name for name, _, _ in COLUMNS]
    count = 0
    with pq.ParquetWriter(path, schema) as writer:
        for rows in runs:
            if rows:
                writer.write_table(pa.Table.from_pydict({n: [r[n] for r in rows] for n in names}, schema=schema))
                count += len(rows)
    return count


def _csv_cell(kind: str, value: Any) -> Any:
    if value is None:
        return ""
    if kind.startswith("list<"):
        return json.dumps(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "double":
        return repr(float(value))
    return value


def _write_csv(runs: Iterator[list[dict]], path: Path) -> int:
    count = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([name for name, _, _ in COLUMNS])
        for rows in runs:
            for row in rows:
                writer.writerow([_csv_cell(kind, row[name]) for name, kind, _ in COLUMNS])
            count += len(rows)
    return count


# ---------------------------------------------------------------------------- manifest
def machine() -> dict[str, Any]:
    """Where the export was written: OS, Python, CPU model and cores, torch and its threads."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "numpy": np.__version__,
    }


def manifest(store: ResultsStore, keys: list[RunKey], table: Path, fmt: str, rows: int) -> dict[str, Any]:
    """The run manifest: heedful's version, every run (model and dataset fingerprints, method,
    options, seed, precision, setting, examples, metrics with their protocols, cost), the seeds,
    metrics and protocols (presets with their fields) used, the schema, and the machine."""
    runs, models, datasets, protocols = [], {}, {}, {}
    for key in keys:
        shared = run_columns(key)
        fp = key.model_fingerprint
        models[fp.digest] = {"label": key.model, "fingerprint": fp.digest, "parts": fp.to_dict()}
        datasets[(key.dataset_fingerprint, key.split)] = {"label": key.dataset, "split": key.split, "fingerprint": key.dataset_fingerprint}
        metrics = []
        for metric, phash, count in store.metric_counts(key):
            if phash not in protocols:
                found = store.protocol(phash)
                protocols[phash] = {"hash": phash, "name": None if found is None else found[0], "fields": None if found is None else found[1]}
            metrics.append({"metric": metric, "protocol": protocols[phash]["name"], "protocol_hash": phash, "examples": count})
        runs.append({
            "run": key.digest,
            "model": key.model,
            "model_fingerprint": fp.digest,
            "dataset": key.dataset,
            "dataset_fingerprint": key.dataset_fingerprint,
            "split": key.split,
            "method": key.method,
            "source": shared["source"],
            "version": key.version,
            "options": json.loads(key.options),
            "given": list(key.given),
            "seed": shared["seed"],
            "precision": shared["precision"],
            "setting": json.loads(key.setting),
            "examples": len(store.explanation_ids(key)),
            "metrics": metrics,
            "cost": store.cost(key),
        })
    return {
        "heedful_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": str(store.path.resolve()),
        "file": table.name,
        "format": fmt,
        "rows": rows,
        "models": list(models.values()),
        "datasets": list(datasets.values()),
        "seeds": sorted({r["seed"] for r in runs if r["seed"] is not None}),
        "metrics": sorted({m["metric"] for r in runs for m in r["metrics"]}),
        "protocols": list(protocols.values()),
        "runs": runs,
        "columns": [{"name": n, "type": t, "description": d} for n, t, d in COLUMNS],
        "machine": machine(),
    }


# ---------------------------------------------------------------------------- entry point
def export_store(store: ResultsStore | str | Path, out: str | Path, format: str = "parquet") -> Export:
    """Write every run of ``store`` (a :class:`ResultsStore`, or the path of one) to ``out`` as
    ``format`` (``"parquet"`` or ``"csv"``), one row per example x run x metric (schema:
    :data:`COLUMNS`), and the run manifest to ``<out stem>.manifest.json`` beside it. ``out``:
    a file path (the format's suffix is added when it has none) or an existing folder (then
    ``bench.<format>`` in it)."""
    if format not in FORMATS:
        raise InputError(f"unknown export format {format!r}", hint=f"use one of: {', '.join(FORMATS)}")
    if format == "parquet":
        require_pyarrow()  # before anything is written
    opened = not isinstance(store, ResultsStore)
    source = open_store(store) if opened else store
    try:
        keys = distinct_runs(source)
        path = _table_path(out, format)
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = _write_parquet if format == "parquet" else _write_csv
        rows = writer(iter_rows(source, keys), path)
        exported = [k for k in keys if source.explanation_ids(k)]
        target = manifest_path(path)
        target.write_text(json.dumps(manifest(source, exported, path, format, rows), indent=2) + "\n", encoding="utf-8")
    finally:
        if opened:
            source.close()
    return Export(path, target, rows)
