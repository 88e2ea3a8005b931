"""``heedful bench dump`` / ``heedful bench load``: a results folder as text, to commit beside a
report and load on another machine, which then computes only what is missing.

A results folder is what ``heedful bench --out`` or ``heedful reproduce`` keeps: results stores
(:mod:`heedful.evaluate.store`, ``results.sqlite``, at any depth) and the files beside them (the
reproductions' per-unit ``.npz`` and ``.json`` files). SQLite files do not diff and a store
copied mid-write may be torn, so :func:`dump_folder` writes each store as JSON Lines --
``<the store's folder>/results.sqlite.jsonl``, one line per row, ``{"table": ..., "row": {column:
value}}``, rows sorted by table and key, so a store that grew dumps to the same lines plus new
ones -- and copies the other files as they are. :func:`load_archive` reads each dump into a new
store and merges it into the folder's store (:func:`heedful.evaluate.merge.merge_stores`: a row
present on both sides must be identical, else nothing of that store is merged), and copies the
other files that the folder lacks; a file the folder already holds with other content is kept and
counted. Both are idempotent: loading an archive twice adds nothing the second time.

Both count the same rows: **result rows**, those of the explanations, measurements and metrics
tables (per table in ``tables``) -- dumped, or added by the load (``present``: those the
destination held already). A dump also writes the bookkeeping tables' rows (``info``, ``runs``,
``costs``, ``protocols``: ``bookkeeping``), which a load merges without counting them as
results; so a folder dumped and loaded into an empty one reports the same number twice.

>>> dump_folder("results/", "archive/")                                      # doctest: +SKIP
ArchiveReport(stores=1, rows=5200, files=2, kept=0, tables={'explanations': 1600, ...}, bookkeeping=110, present=None)
>>> load_archive("archive/", "elsewhere/")                                   # doctest: +SKIP
ArchiveReport(stores=1, rows=5200, files=2, kept=0, tables={'explanations': 1600, ...}, bookkeeping=0, present=0)
"""

from __future__ import annotations

import filecmp
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from heedful.errors import HeedfulError
from heedful.evaluate.merge import merge_stores, require_schema
from heedful.evaluate.store import FILE_NAME, ResultsStore
from heedful.files.atomic import PART_SUFFIX, atomic_file

DUMP_NAME = FILE_NAME + ".jsonl"
"""The dump of one store, in the archive at the store's relative folder."""

KEYS: dict[str, tuple[str, ...]] = {
    "info": ("key",),
    "runs": ("run", "model", "dataset"),
    "explanations": ("run", "example_id"),
    "measurements": ("run", "source", "protocol_hash", "example_id"),
    "metrics": ("run", "metric", "protocol_hash", "example_id"),
    "costs": ("run",),
    "protocols": ("protocol_hash",),
}
"""The tables of a schema-2 store and their primary keys, in the dump's order (a schema-1
store's renamed ``schema1_*`` tables are never read, so they are not dumped)."""

_STORE_FILES = (FILE_NAME, FILE_NAME + "-wal", FILE_NAME + "-shm", FILE_NAME + "-journal")
_PARTIAL = (PART_SUFFIX, ".tmp")  # ".tmp": files of writers from before heedful.files.atomic


RESULTS = ("explanations", "measurements", "metrics")
"""The tables whose rows a dump and a load count (see the module docstring)."""


@dataclass
class ArchiveReport:
    """What one dump or load did: ``stores`` dumped or merged, their result ``rows`` (dumped, or
    added by the merge; per table in ``tables``), other ``files`` copied, and files ``kept``
    because the destination already held other content under their name. A dump's
    ``bookkeeping``: rows of the other tables it wrote; a load's ``present``: result rows the
    destination held already (``None`` for a dump)."""

    stores: int = 0
    rows: int = 0
    files: int = 0
    kept: int = 0
    tables: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    bookkeeping: int = 0
    present: int | None = None

    def count(self, table: str, rows: int) -> None:
        if table in RESULTS:
            self.tables[table] += rows
            self.rows += rows
        else:
            self.bookkeeping += rows

    def line(self, verb: str, source: Path, dest: Path) -> str:
        """``dumped results/ into archive/: 1 store, 5200 result rows (1600 explanations, ...;
        110 rows of runs, costs and protocols besides), 2 files copied``."""
        each = ", ".join(f"{n} {t}" for t, n in self.tables.items())
        besides = f"; {self.bookkeeping} rows of runs, costs and protocols besides" if self.bookkeeping else ""
        known = f"; {self.present} already present" if self.present is not None else ""
        added = " added" if self.present is not None else ""
        kept = f", {self.kept} kept (the destination's differ)" if self.kept else ""
        return (
            f"{verb} {source} into {dest}: {self.stores} store{'s' * (self.stores != 1)}, {self.rows} result rows{added}"
            f" ({each}{known}{besides}), {self.files} files copied{kept}"
        )


def dump_folder(folder: str | Path, archive: str | Path) -> ArchiveReport:
    """Write every results store under ``folder`` as JSON Lines into ``archive`` (same relative
    folders) and copy the other files there; see the module docstring."""
    archive = Path(archive)
    report = ArchiveReport()
    for path, rel in _walk(folder, "results folder", archive):
        if path.name == FILE_NAME:
            for table, rows in _dump_store(path, archive / rel.parent / DUMP_NAME).items():
                report.count(table, rows)
            report.stores += 1
        elif path.name not in _STORE_FILES:
            report.files += _copy(path, archive / rel, replace=True)
    return report


def load_archive(archive: str | Path, folder: str | Path) -> ArchiveReport:
    """Merge every dumped store of ``archive`` into the store at the same relative folder of
    ``folder`` (created when missing) and copy the files ``folder`` lacks; see the module docstring."""
    folder = Path(folder)
    report = ArchiveReport(present=0)
    for path, rel in _walk(archive, "archive", folder):
        if path.name == DUMP_NAME:
            with tempfile.TemporaryDirectory(prefix="heedful-load-") as tmp:
                _read_dump(path, Path(tmp) / FILE_NAME)
                merged = merge_stores(folder / rel.parent, [Path(tmp) / FILE_NAME])
            for table in RESULTS:
                report.count(table, merged.added[table])
            report.present += sum(merged.present.values())
            report.stores += 1
        else:
            copied = _copy(path, folder / rel, replace=False)
            report.files += copied
            report.kept += not copied and not filecmp.cmp(path, folder / rel, shallow=False)
    return report


def _walk(source: str | Path, what: str, dest: str | Path) -> Iterator[tuple[Path, Path]]:
    """``(file, its path relative to source)`` for the files of the existing folder ``source``
    (``what`` names it in the error) in a fixed order, partial writes (``*.part``, ``*.tmp*``)
    left out; ``dest`` must lie outside it and it outside ``dest`` (each dump would copy the last)."""
    source = Path(source)
    if not source.is_dir():
        raise HeedfulError(f"no {what} at {source}", hint="give an existing folder (heedful bench --out, or a heedful reproduce store)")
    a, b = source.resolve(), Path(dest).resolve()
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        raise HeedfulError(f"the {what} {source} and {dest} overlap", hint="give an archive folder outside the results folder")
    for path in sorted(source.rglob("*")):
        if path.is_file() and not any(s in path.suffixes for s in _PARTIAL):
            yield path, path.relative_to(source)


def _copy(source: Path, dest: Path, replace: bool) -> bool:
    """Copy ``source`` to ``dest`` when ``dest`` is missing (or differs, with ``replace``); whether it copied."""
    if dest.is_file() and (not replace or filecmp.cmp(source, dest, shallow=False)):
        return False
    with atomic_file(dest) as part:
        shutil.copyfile(source, part)
    return True


def _dump_store(store: Path, dest: Path) -> dict[str, int]:
    """Rows of ``store`` as sorted JSON lines into ``dest`` (written whole, then renamed); the
    rows written per table."""
    db = sqlite3.connect(store, timeout=60)
    try:
        require_schema(db, "main", store)
        rows = dict.fromkeys(KEYS, 0)
        with atomic_file(dest) as part, db, open(part, "w", encoding="utf-8", newline="\n") as fh:  # one read transaction: a consistent snapshot
            db.execute("BEGIN")
            for table, keys in KEYS.items():
                cursor = db.execute(f"SELECT * FROM {table} ORDER BY {', '.join(keys)}")
                columns = [c[0] for c in cursor.description]
                for values in cursor:
                    fh.write(json.dumps({"table": table, "row": dict(zip(columns, values, strict=True))}, sort_keys=True, ensure_ascii=False) + "\n")
                    rows[table] += 1
        return rows
    finally:
        db.close()


def _read_dump(dump: Path, store: Path) -> None:
    """A new store at ``store`` holding the rows of ``dump`` (its ``info`` included, so a dump of
    another schema is refused by the merge)."""
    ResultsStore(store).close()
    db = sqlite3.connect(store)
    try:
        columns = {t: {c[1] for c in db.execute(f"PRAGMA table_info({t})")} for t in KEYS}
        with db, open(dump, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                try:
                    entry = json.loads(line)
                    table, row = entry["table"], entry["row"]
                    if table not in KEYS or not set(row) <= columns[table]:
                        raise ValueError(f"unknown table {table!r} or columns {sorted(set(row) - columns.get(table, set()))}")
                    db.execute(
                        f"INSERT OR REPLACE INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
                    )
                except (ValueError, KeyError, TypeError, sqlite3.Error) as exc:
                    raise HeedfulError(
                        f"{dump}, line {number}: not a row of a results store dump ({exc})",
                        hint="write the archive with heedful bench dump and do not edit it",
                    ) from None
    finally:
        db.close()
