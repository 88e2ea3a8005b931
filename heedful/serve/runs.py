"""Browsing a results store (``heedful bench --out``): the runs it holds and their tables and
curves, read back with the store's keys and aggregated as ``heedful bench`` aggregates them.

A run here is what one ``heedful bench`` invocation measures: a model on a dataset split under
one explanation setting and one protocol. Its id is a digest of those, so a request names a run
only by id -- never by a path."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from heedful.evaluate.bench import Run, collect
from heedful.evaluate.protocol import Protocol
from heedful.evaluate.store import FILE_NAME, ResultsStore, RunKey
from heedful.serve.compute import number, numbers
from heedful.serve.errors import ApiError

CURVE_ORDER = ("aopc", "deletion", "sufficiency", "insertion")
"""The metric whose mean curve a run shows per method: the first of these it has."""


@dataclass
class StoredRun:
    """One bench run found in a store: its members (method keys), metrics and examples."""

    model: str
    dataset: str
    split: str
    setting: str
    protocol_hash: str
    members: list[RunKey] = field(default_factory=list)
    metrics: set[str] = field(default_factory=set)
    n: int = 0
    created: float = float("inf")

    @property
    def id(self) -> str:
        raw = json.dumps([self.model, self.dataset, self.split, self.setting, self.protocol_hash])
        return hashlib.sha256(raw.encode()).hexdigest()[:12]

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "dataset": self.dataset,
            "split": self.split,
            "methods": sorted({key.method for key in self.members}),
            "metrics": sorted(self.metrics),
            "n": self.n,
            "created": datetime.fromtimestamp(self.created, UTC).isoformat(timespec="seconds"),
        }


def store_file(folder: Path | None) -> Path | None:
    """The store's SQLite file in ``folder`` (or ``folder`` itself), if there is one."""
    if folder is None:
        return None
    path = folder if folder.suffix in (".sqlite", ".db") else folder / FILE_NAME
    return path if path.is_file() else None


def _runs(store: ResultsStore) -> dict[str, StoredRun]:
    found: dict[str, StoredRun] = {}
    for key, created in store.run_keys():
        for metric, phash, count in store.metric_counts(key):
            run = StoredRun(key.model, key.dataset, key.split, key.setting, phash)
            run = found.setdefault(run.id, run)
            if key not in run.members:
                run.members.append(key)
            run.metrics.add(metric)
            run.n = max(run.n, int(count))
            run.created = min(run.created, created)
    return found


def list_runs(folder: Path | None) -> list[dict[str, Any]]:
    """``GET /api/runs``: every run of the store, newest first (none without a store)."""
    path = store_file(folder)
    if path is None:
        return []
    with ResultsStore(path) as store:
        runs = _runs(store)
    return sorted((run.row() for run in runs.values()), key=lambda row: row["created"], reverse=True)


def _groups(members: list[RunKey]) -> list[Run]:
    """The run's method keys as ``heedful bench`` groups them: the seeds of a stochastic method
    form one group; the same method under other options is a group of its own."""
    settings: dict[str, list[str]] = {}
    found = []
    for key in members:
        options = {k: v for k, v in json.loads(key.options).items() if k != "seed"}
        variant = json.dumps(options, sort_keys=True)
        variants = settings.setdefault(key.method, [])
        if variant not in variants:
            variants.append(variant)
        found.append((key, variants.index(variant)))
    return [
        Run(key.method, key.method if len(settings[key.method]) == 1 else f"{key.method} #{index + 1}", json.loads(key.options), key)
        for key, index in found
    ]


def get_run(folder: Path | None, ident: str) -> dict[str, Any]:
    """``GET /api/runs/{id}``: per method and metric the mean over examples with its 95 %
    bootstrap interval (stochastic methods: the mean over their seeds), and each method's mean
    curve of the first of :data:`CURVE_ORDER` the run measured."""
    path = store_file(folder)
    if path is None:
        raise ApiError(404, f"unknown run {ident!r}: this server has no results store", "start heedful serve with --store FOLDER (a heedful bench --out folder)")
    with ResultsStore(path) as store:
        run = _runs(store).get(ident)
        if run is None:
            raise ApiError(404, f"unknown run {ident!r}", "GET /api/runs lists the runs of this server's store")
        stored = store.protocol(run.protocol_hash)
        protocol = Protocol(name=stored[0], **stored[1]) if stored else None
        if protocol is None or protocol.hash() != run.protocol_hash:
            raise ApiError(422, f"run {ident} was measured under a protocol this heedful cannot rebuild", "re-run heedful bench with this version")
        ids = sorted({i for key in run.members for metric in run.metrics for i in store.metric_ids(key, metric, run.protocol_hash)})
        metrics = sorted(run.metrics)
        results, x = collect(store, _groups(run.members), ids, metrics, protocol)
    shown = next((m for m in CURVE_ORDER if m in metrics), None)
    return {
        **run.row(),
        "protocol": protocol.name,
        "table": [
            {"method": group, "metric": metric, "mean": number(s.value), "low": number(s.low), "high": number(s.high), "n": s.n}
            for group, result in results.items()
            for metric, s in result.summaries.items()
        ],
        "curve_metric": shown,
        "curves": {
            group: {"fraction": numbers(x), "value": numbers(result.summaries[shown].curve)}
            for group, result in results.items()
            if shown is not None and result.summaries[shown].curve is not None
        },
    }

