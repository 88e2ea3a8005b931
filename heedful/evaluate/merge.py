"""``heedful bench merge``: results stores of one bench computed in shards, merged into one.

A results store has a single writer (the bench driver). When one driver cannot write as fast as
its workers compute (docs/scale.md), split the bench -- e.g. one ``--out`` folder per machine or
per method -- and merge the stores at the end. Rows are keyed by everything that decides them
(:mod:`heedful.evaluate.store`), so shards of one bench hold either different keys or the same
key with the same row: a row present in two stores must be identical (write times and an explanation's wall seconds aside), else
the merge stops with a one-line error and writes nothing of that store. Each store is merged in
one transaction. A run's cost record adds up the work of the stores that brought new explanations
of it (shards that overlap count their common examples twice, so seconds per example stay a
true average; a store whose explanations were all present adds nothing).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from heedful.errors import HeedfulError
from heedful.evaluate.store import FILE_NAME, SCHEMA_VERSION, ResultsStore

TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # table: (key columns, values compared: SQL of a row ``{r}``); an explanation's wall seconds
    # vary from one computation of it to the next, and how its tokens are written changed when
    # raw_tokens were kept apart (the tokenizer, fingerprinted in the key, decides them)
    "explanations": (("run", "example_id"), ("json_remove({r}.explanation, '$.cost.seconds', '$.tokens', '$.raw_tokens')",)),
    "measurements": (("run", "source", "protocol_hash", "example_id"), ("{r}.data",)),
    "metrics": (("run", "metric", "protocol_hash", "example_id"), ("{r}.value", "{r}.curve", "{r}.extra")),
    "protocols": (("protocol_hash",), ("{r}.fields",)),
}
"""The tables whose rows must agree across stores, by key."""


@dataclass
class MergeReport:
    """Rows ``added`` to the merged store per table, and rows ``present`` already (identical)."""

    path: Path
    stores: int = 0
    added: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TABLES if t != "protocols"})
    present: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TABLES if t != "protocols"})

    def line(self) -> str:
        """``merged 3 stores into results/results.sqlite: 1200 explanations, ... (0 already present)``."""
        parts = ", ".join(f"{self.added[t]} {t}" for t in self.added)
        known = sum(self.present.values())
        return f"merged {self.stores} stores into {self.path}: {parts} added ({known} rows already present)"


def _store_file(path: str | Path) -> Path:
    path = Path(path)
    found = path if path.suffix in (".sqlite", ".db") else path / FILE_NAME
    if not found.is_file():
        raise HeedfulError(f"no results store at {path}", hint=f"give a --out folder of heedful bench (holding {FILE_NAME}) or a .sqlite file")
    return found


def require_schema(db: sqlite3.Connection, alias: str, path: Path) -> None:
    """Refuse the store attached as ``alias`` (``"main"``: the connection's own) unless it is of
    this heedful's schema; ``path`` names it in the error."""
    row = db.execute(f"SELECT value FROM {alias}.info WHERE key='schema'").fetchone() if _has(db, alias, "info") else None
    if row is None or int(row[0]) != SCHEMA_VERSION:
        found = "none" if row is None else row[0]
        raise HeedfulError(
            f"{path} is not a results store of schema {SCHEMA_VERSION} (found {found})",
            hint="open it once with this heedful (heedful bench ... --out it) or merge stores of one heedful version",
        )


def _has(db: sqlite3.Connection, alias: str, table: str) -> bool:
    return db.execute(f"SELECT 1 FROM {alias}.sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def merge_stores(out: str | Path, stores: Sequence[str | Path]) -> MergeReport:
    """Merge the results ``stores`` (folders or ``.sqlite`` files) into the store at ``out``
    (created when missing; its own rows are kept). See the module docstring."""
    if not stores:
        raise HeedfulError("no store to merge", hint="heedful bench merge OUT STORE [STORE ...]")
    sources = [_store_file(s) for s in stores]
    with ResultsStore(out) as target:
        target_path = target.path
    report = MergeReport(target_path)
    db = sqlite3.connect(target_path, timeout=60, isolation_level=None)
    try:
        for source in sources:
            if source.resolve() == target_path.resolve():
                raise HeedfulError(f"{source} is the merged store itself", hint="give OUT a new folder")
            db.execute("ATTACH DATABASE ? AS src", (str(source),))
            try:
                require_schema(db, "src", source)
                db.execute("BEGIN IMMEDIATE")
                try:
                    _merge_one(db, source, report)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            finally:
                db.execute("DETACH DATABASE src")
            report.stores += 1
    finally:
        db.close()
    return report


def _merge_one(db: sqlite3.Connection, source: Path, report: MergeReport) -> None:
    """Rows of the attached store ``src`` into ``main`` (inside the caller's transaction)."""
    for table, (keys, values) in TABLES.items():
        on = " AND ".join(f"a.{k} = b.{k}" for k in keys)
        differs = " OR ".join(f"{v.format(r='a')} IS NOT {v.format(r='b')}" for v in values)
        clash = db.execute(f"SELECT {', '.join('a.' + k for k in keys)} FROM src.{table} a JOIN main.{table} b ON {on} WHERE {differs} LIMIT 1").fetchone()
        if clash is not None:
            where = ", ".join(f"{k} {v}" for k, v in zip(keys, clash, strict=True))
            raise HeedfulError(
                f"{source}: {table} row ({where}) differs from the one already merged",
                hint="merge only shards of one bench (same heedful, model and data); nothing of this store was merged",
            )
        if table == "protocols":
            db.execute(f"INSERT OR IGNORE INTO main.{table} SELECT * FROM src.{table}")
            continue
        present = db.execute(f"SELECT COUNT(*) FROM src.{table} a JOIN main.{table} b ON {on}").fetchone()[0]
        total = db.execute(f"SELECT COUNT(*) FROM src.{table}").fetchone()[0]
        if table == "explanations":  # costs of the runs this store brings explanations of
            db.execute(
                "INSERT INTO main.costs SELECT c.* FROM src.costs c WHERE EXISTS (SELECT 1 FROM src.explanations a"
                " WHERE a.run = c.run AND NOT EXISTS (SELECT 1 FROM main.explanations b WHERE b.run = a.run AND b.example_id = a.example_id))"
                " ON CONFLICT (run) DO UPDATE SET examples = examples + excluded.examples, seconds = seconds + excluded.seconds,"
                " forward = forward + excluded.forward, backward = backward + excluded.backward,"
                " peak_mb = max(coalesce(peak_mb, 0), excluded.peak_mb)"
            )
        db.execute(f"INSERT OR IGNORE INTO main.{table} SELECT * FROM src.{table}")
        report.added[table] += total - present
        report.present[table] += present
    db.execute("INSERT OR IGNORE INTO main.runs SELECT * FROM src.runs")
