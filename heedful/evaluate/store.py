"""The results store: one SQLite file (stdlib ``sqlite3``) holding every per-example result.

Tables
------
``explanations``
    key (model, dataset, split, example_id, method, options_hash) -> ``Explanation.to_json()``.
    ``options_hash`` covers the method options (seed included), the target choice and
    ``max_length`` -- everything that changes the explanation.
``measurements``
    key (..., options_hash, source, protocol_hash) -> raw perturbation measurements of one
    example (``source`` = ``remove`` / ``keep`` / ``loo``) as JSON, so that a further metric on
    the same curves needs no forward pass.
``metrics``
    key (..., options_hash, metric, protocol_hash) -> ``value``, ``curve`` (JSON list) and
    ``extra`` (JSON) of one example.
``costs``
    per (model, dataset, split, method, options_hash): examples explained, seconds, forward and
    backward passes, peak memory -- accumulated over interrupted runs.
``protocols``
    protocol_hash -> the protocol's fields (JSON), for reading a store without heedful's presets.

Every write commits at once (WAL journal), so a run killed at any point loses at most the batch
in flight, and the next run computes only what is missing.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heedful.errors import HeedfulError
from heedful.explanation import Explanation

FILE_NAME = "results.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS explanations (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    explanation TEXT NOT NULL, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, example_id));
CREATE TABLE IF NOT EXISTS measurements (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    source TEXT, protocol_hash TEXT, data TEXT NOT NULL, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, source, protocol_hash, example_id));
CREATE TABLE IF NOT EXISTS metrics (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    metric TEXT, protocol_hash TEXT, value REAL, curve TEXT, extra TEXT, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, metric, protocol_hash, example_id));
CREATE TABLE IF NOT EXISTS costs (
    model TEXT, dataset TEXT, split TEXT, method TEXT, options_hash TEXT,
    examples INTEGER, seconds REAL, forward REAL, backward REAL, peak_mb REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash));
CREATE TABLE IF NOT EXISTS protocols (protocol_hash TEXT PRIMARY KEY, name TEXT, fields TEXT);
"""


@dataclass(frozen=True)
class RunKey:
    """Which explanations: a method (with options) on a split of a dataset, for a model."""

    model: str
    dataset: str
    split: str
    method: str
    options_hash: str

    @property
    def values(self) -> tuple[str, str, str, str, str]:
        return (self.model, self.dataset, self.split, self.method, self.options_hash)


_WHERE = "model=? AND dataset=? AND split=? AND method=? AND options_hash=?"


def _json(value: Any) -> str:
    """JSON with NaN / inf written as null (valid JSON for any reader)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        if hasattr(v, "tolist"):
            return clean(v.tolist())
        return v

    return json.dumps(clean(value))


def _nan(value: Any) -> Any:
    """JSON null back to NaN inside lists."""
    if value is None:
        return float("nan")
    if isinstance(value, list):
        return [_nan(v) for v in value]
    return value


class ResultsStore:
    """A results store in ``folder/results.sqlite`` (or at a ``.sqlite`` file path).

    ``written`` counts rows written by this object per table -- a resumed run that finds
    everything stored writes none.

    >>> store = ResultsStore(tmp_path)                                      # doctest: +SKIP
    >>> store.explanation_ids(RunKey("m", "movies", "test", "saliency", "0" * 16))  # doctest: +SKIP
    set()
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix not in (".sqlite", ".db"):
            path.mkdir(parents=True, exist_ok=True)
            path = path / FILE_NAME
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self.db = sqlite3.connect(path, timeout=60)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT value FROM info WHERE key='schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO info VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise HeedfulError(
                    f"{path} was written by another version of heedful (schema {row[0]})",
                    hint="use a new --out folder",
                )
            self.db.commit()
        except sqlite3.DatabaseError as exc:
            raise HeedfulError(f"cannot open the results store {path}: {exc}", hint="use a new --out folder") from exc
        self.written = {"explanations": 0, "measurements": 0, "metrics": 0}

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ explanations
    def explanation_ids(self, key: RunKey) -> set[str]:
        rows = self.db.execute(f"SELECT example_id FROM explanations WHERE {_WHERE}", key.values)
        return {r[0] for r in rows}

    def put_explanations(self, key: RunKey, items: Iterable[tuple[str, Explanation]]) -> None:
        now = time.time()
        rows = [(*key.values[:3], ident, *key.values[3:], expl.to_json(), now) for ident, expl in items]
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO explanations (model, dataset, split, example_id, method, options_hash,"
                " explanation, created) VALUES (?,?,?,?,?,?,?,?)",
                rows,
            )
        self.written["explanations"] += len(rows)

    def get_explanations(self, key: RunKey, ids: Sequence[str] | None = None) -> dict[str, Explanation]:
        rows = self.db.execute(f"SELECT example_id, explanation FROM explanations WHERE {_WHERE}", key.values)
        wanted = None if ids is None else set(ids)
        return {
            ident: Explanation.from_dict(json.loads(text))
            for ident, text in rows
            if wanted is None or ident in wanted
        }

    # ------------------------------------------------------------------ raw measurements
    def measurement_ids(self, key: RunKey, source: str, protocol_hash: str) -> set[str]:
        rows = self.db.execute(
            f"SELECT example_id FROM measurements WHERE {_WHERE} AND source=? AND protocol_hash=?",
            (*key.values, source, protocol_hash),
        )
        return {r[0] for r in rows}

    def put_measurements(self, key: RunKey, source: str, protocol_hash: str, items: Iterable[tuple[str, dict]]) -> None:
        now = time.time()
        rows = [(*key.values[:3], ident, *key.values[3:], source, protocol_hash, _json(data), now) for ident, data in items]
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO measurements (model, dataset, split, example_id, method, options_hash,"
                " source, protocol_hash, data, created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
        self.written["measurements"] += len(rows)

    def get_measurements(self, key: RunKey, source: str, protocol_hash: str, ids: Sequence[str] | None = None) -> dict[str, dict]:
        rows = self.db.execute(
            f"SELECT example_id, data FROM measurements WHERE {_WHERE} AND source=? AND protocol_hash=?",
            (*key.values, source, protocol_hash),
        )
        wanted = None if ids is None else set(ids)
        return {
            ident: {k: _nan(v) for k, v in json.loads(text).items()}
            for ident, text in rows
            if wanted is None or ident in wanted
        }

    # ------------------------------------------------------------------ metric values
    def metric_ids(self, key: RunKey, metric: str, protocol_hash: str) -> set[str]:
        rows = self.db.execute(
            f"SELECT example_id FROM metrics WHERE {_WHERE} AND metric=? AND protocol_hash=?",
            (*key.values, metric, protocol_hash),
        )
        return {r[0] for r in rows}

    def put_metrics(
        self,
        key: RunKey,
        metric: str,
        protocol_hash: str,
        items: Iterable[tuple[str, float, Sequence[float] | None, dict | None]],
    ) -> None:
        """Store ``(example_id, value, curve, extra)`` rows of one metric."""
        now = time.time()
        rows = [
            (
                *key.values[:3], ident, *key.values[3:], metric, protocol_hash,
                float(value) if value is not None and math.isfinite(value) else None,
                None if curve is None else _json(list(curve)),
                None if extra is None else _json(extra),
                now,
            )
            for ident, value, curve, extra in items
        ]
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO metrics (model, dataset, split, example_id, method, options_hash, metric,"
                " protocol_hash, value, curve, extra, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
        self.written["metrics"] += len(rows)

    def get_metrics(
        self, key: RunKey, metric: str, protocol_hash: str, ids: Sequence[str] | None = None
    ) -> dict[str, tuple[float, list[float] | None, dict | None]]:
        """``example_id -> (value, curve, extra)`` (NaN for undefined values)."""
        rows = self.db.execute(
            f"SELECT example_id, value, curve, extra FROM metrics WHERE {_WHERE} AND metric=? AND protocol_hash=?",
            (*key.values, metric, protocol_hash),
        )
        wanted = None if ids is None else set(ids)
        found = {}
        for ident, value, curve, extra in rows:
            if wanted is not None and ident not in wanted:
                continue
            found[ident] = (
                float("nan") if value is None else float(value),
                None if curve is None else _nan(json.loads(curve)),
                None if extra is None else {k: _nan(v) for k, v in json.loads(extra).items()},
            )
        return found

    def record_explained(self, key: RunKey, items: Sequence[tuple[str, Explanation]], seconds: float, peak_mb: float) -> None:
        """Store freshly computed explanations and add what they cost: ``seconds`` of wall time,
        their forward and backward passes, and the process's peak memory ``peak_mb``."""
        self.put_explanations(key, items)
        self.add_cost(
            key, len(items), seconds, sum(e.cost.forward_passes for _, e in items),
            sum(e.cost.backward_passes for _, e in items), peak_mb,
        )

    # ------------------------------------------------------------------ costs and protocols
    def add_cost(self, key: RunKey, examples: int, seconds: float, forward: float, backward: float, peak_mb: float) -> None:
        with self.db:
            row = self.db.execute(f"SELECT examples, seconds, forward, backward, peak_mb FROM costs WHERE {_WHERE}", key.values).fetchone()
            if row is not None:
                examples += row[0]
                seconds += row[1]
                forward += row[2]
                backward += row[3]
                peak_mb = max(peak_mb, row[4] or 0.0)
            self.db.execute(
                "INSERT OR REPLACE INTO costs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (*key.values, examples, seconds, forward, backward, peak_mb),
            )

    def cost(self, key: RunKey) -> dict[str, float] | None:
        """Totals for a run: examples, seconds, forward / backward passes, peak memory (MB)."""
        row = self.db.execute(f"SELECT examples, seconds, forward, backward, peak_mb FROM costs WHERE {_WHERE}", key.values).fetchone()
        if row is None:
            return None
        return dict(zip(("examples", "seconds", "forward", "backward", "peak_mb"), row, strict=True))

    def put_protocol(self, protocol_hash: str, name: str, fields: dict) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO protocols VALUES (?,?,?)", (protocol_hash, name, _json(fields)))
