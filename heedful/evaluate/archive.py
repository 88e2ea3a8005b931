"""``heedful bench dump`` / ``heedful bench load``: a results folder as text, to commit beside a
report and load on another machine, which then computes only what is missing.

A results folder is what ``heedful bench --out`` or ``heedful reproduce`` keeps: results stores
(:mod:`heedful.evaluate.store`, ``results.sqlite``, at any depth) and the files beside them (the
reproductions' per-unit ``.npz`` and ``.json`` files). SQLite files do not diff and a store
copied mid-write may be torn, so :func:`dump_folder` writes each store as JSON Lines, one line per
row, ``{"table": ..., "row": {column: value}}``, rows sorted by table and key, so a store that grew
dumps to the same lines plus new ones -- and copies the other files as they are. A store's lines
are split into shards by the first hex digit of their run's key (``<the store's folder>/
results.sqlite.<digit>.jsonl``; rows without a run, the ``info`` and ``protocols`` tables, in
``results.sqlite.jsonl``): run keys are digests, so each shard holds about a sixteenth of the
store (the 150 MB store of the mask-lrp report dumps to shards of at most 22.5 MB, under the
100 MB a file a code host takes), and a row always lands in the same shard. A dump removes the
store's shards that an older dump left and this one did not write; an archive of one
``results.sqlite.jsonl`` holding every row (written before the shards) loads as well.
:func:`load_archive` reads each store's shards into a new store and merges it into the folder's store (:func:`heedful.evaluate.merge.merge_stores`: a row
present on both sides must be identical, else nothing of that store is merged), and copies the
other files that the folder lacks; a file the folder already holds with other content is kept and
counted. Both are idempotent: loading an archive twice adds nothing the second time.

Both count the same rows: **result rows**, those of the explanations, measurements and metrics
tables (per table in ``tables``) -- dumped, or added by the load (``present``: those the
destination held already). A dump also writes the bookkeeping tables' rows (``info``, ``runs``,
``costs``, ``protocols``: ``bookkeeping``), which a load merges without counting them as
results; so a folder dumped and loaded into an empty one reports the same number twice.

>>> dump_folder("results/", "archive/")                                      # doctest: +SKIP
ArchiveReport(stores=1, rows=5200, files=2, kept=0, tables={'explanations': 1600, ...}, bookkeeping=110, present=None, largest=61302)
>>> load_archive("archive/", "elsewhere/")                                   # doctest: +SKIP
ArchiveReport(stores=1, rows=5200, files=2, kept=0, tables={'explanations': 1600, ...}, bookkeeping=0, present=0, largest=0)
"""

from __future__ import annotations

import filecmp
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from heedful.errors import HeedfulError
from heedful.evaluate.merge import merge_stores, require_schema
from heedful.evaluate.store import FILE_NAME, ResultsStore
from heedful.files.atomic import PART_SUFFIX, atomic_file

DUMP_NAME = FILE_NAME + ".jsonl"
"""The dump of one store's rows without a run, in the archive at the store's relative folder
(the shards of its other rows beside it: :func:`shard_name`)."""

SHARDS = "0123456789abcdef"
"""The first characters of run keys (hex digests), one shard each."""

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
    ``bookkeeping``: rows of the other tables it wrote, ``largest``: the size of its largest
    shard in bytes; a load's ``present``: result rows the destination held already (``None`` for
    a dump)."""

    stores: int = 0
    rows: int = 0
    files: int = 0
    kept: int = 0
    tables: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    bookkeeping: int = 0
    present: int | None = None
    largest: int = 0

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
        largest = f"; largest shard {self.largest / 1e6:.1f} MB" if self.largest else ""
        return (
            f"{verb} {source} into {dest}: {self.stores} store{'s' * (self.stores != 1)}, {self.rows} result rows{added}"
            f" ({each}{known}{besides}), {self.files} files copied{kept}{largest}"
        )


def shard_name(run: str | None) -> str:
    """The dump file of rows of ``run``: ``results.sqlite.<first hex digit>.jsonl``, and
    :data:`DUMP_NAME` for rows without a run (or, never written by heedful, a key not a digest).

    >>> shard_name("0ba1dabfd2659970"), shard_name(None)
    ('results.sqlite.0.jsonl', 'results.sqlite.jsonl')
    """
    return f"{FILE_NAME}.{run[0]}.jsonl" if run and run[0] in SHARDS else DUMP_NAME


_DUMP_NAMES = frozenset({DUMP_NAME, *(shard_name(c) for c in SHARDS)})


def dump_folder(folder: str | Path, archive: str | Path) -> ArchiveReport:
    """Write every results store under ``folder`` as JSON Lines into ``archive`` (same relative
    folders) and copy the other files there; see the module docstring."""
    archive = Path(archive)
    report = ArchiveReport()
    for path, rel in _walk(folder, "results folder", archive):
        if path.name == FILE_NAME:
            for table, rows in _dump_store(path, archive / rel.parent).items():
                report.count(table, rows)
            report.largest = max([report.largest, *(p.stat().st_size for p in (archive / rel.parent).iterdir() if p.name in _DUMP_NAMES)])
            report.stores += 1
        elif path.name not in _STORE_FILES:
            report.files += _copy(path, archive / rel, replace=True)
    return report


def load_archive(archive: str | Path, folder: str | Path) -> ArchiveReport:
    """Merge every dumped store of ``archive`` into the store at the same relative folder of
    ``folder`` (created when missing) and copy the files ``folder`` lacks; see the module docstring."""
    folder = Path(folder)
    report = ArchiveReport(present=0)
    read: set[Path] = set()
    for path, rel in _walk(archive, "archive", folder):
        if path.name in _DUMP_NAMES:
            if path.parent in read:
                continue
            read.add(path.parent)
            with tempfile.TemporaryDirectory(prefix="heedful-load-") as tmp:
                _read_dump(sorted(p for p in path.parent.iterdir() if p.name in _DUMP_NAMES), Path(tmp) / FILE_NAME)
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
    """Rows of ``store`` as sorted JSON lines into the shards in folder ``dest`` (each written
    whole, then renamed; shards of an older dump not written now removed); the rows written per
    table."""
    db = sqlite3.connect(store, timeout=60)
    try:
        require_schema(db, "main", store)
        rows = dict.fromkeys(KEYS, 0)
        with ExitStack() as files, db:
            shards: dict[str, TextIO] = {}

            def shard(name: str) -> TextIO:
                if name not in shards:
                    part = files.enter_context(atomic_file(dest / name))
                    shards[name] = files.enter_context(open(part, "w", encoding="utf-8", newline="\n"))
                return shards[name]

            shard(DUMP_NAME)  # written even when empty: the store's mark in the archive
            db.execute("BEGIN")  # one read transaction: a consistent snapshot
            for table, keys in KEYS.items():
                cursor = db.execute(f"SELECT * FROM {table} ORDER BY {', '.join(keys)}")
                columns = [c[0] for c in cursor.description]
                for values in cursor:
                    row = dict(zip(columns, values, strict=True))
                    shard(shard_name(row.get("run"))).write(json.dumps({"table": table, "row": row}, sort_keys=True, ensure_ascii=False) + "\n")
                    rows[table] += 1
        for stale in _DUMP_NAMES - set(shards):
            (dest / stale).unlink(missing_ok=True)
        return rows
    finally:
        db.close()


def _read_dump(dumps: list[Path], store: Path) -> None:
    """A new store at ``store`` holding the rows of one store's dump files ``dumps`` (its ``info``
    included, so a dump of another schema is refused by the merge)."""
    ResultsStore(store).close()
    db = sqlite3.connect(store)
    try:
        columns = {t: {c[1] for c in db.execute(f"PRAGMA table_info({t})")} for t in KEYS}
        with db:
            for dump in dumps:
                _insert_lines(db, dump, columns)
    finally:
        db.close()


def _insert_lines(db: sqlite3.Connection, dump: Path, columns: dict[str, set[str]]) -> None:
    """Insert the rows of one dump file into ``db`` (``columns``: each table's)."""
    with open(dump, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                entry = json.loads(line)
                table, row = entry["table"], entry["row"]
                if table not in KEYS or not set(row) <= columns[table]:
                    raise ValueError(f"unknown table {table!r} or columns {sorted(set(row) - columns.get(table, set()))}")
                db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
            except (ValueError, KeyError, TypeError, sqlite3.Error) as exc:
                raise HeedfulError(
                    f"{dump}, line {number}: not a row of a results store dump ({exc})",
                    hint="write the archive with heedful bench dump and do not edit it",
                ) from None
