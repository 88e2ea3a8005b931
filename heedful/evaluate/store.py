"""The results store: one SQLite file (stdlib ``sqlite3``) holding every per-example result,
keyed by everything that decides it.

Keys
----
A :class:`RunKey` is one setting of explanations: the method, its complete options (defaults
included, runtime options such as chunk sizes left out), the method's ``version``, the
fingerprints of the model (weights, config, tokenizer) and of the dataset split's content, the
split, and the explanation setting (label choice, ``max_length``, language-model word). Its
``digest`` keys every row. :func:`run_key` is the one place keys are built -- ``heedful bench``,
``heedful rectify`` and the reproductions all call it -- so a changed default, a new method
version, rebuilt weights or an edited CSV never meet an old row.

Tables
------
``runs``
    digest -> the key in readable columns: model label (zoo name or folder path), dataset label,
    split, method, options JSON, the options the caller gave, version, explanation setting and
    fingerprints. A run that finds rows of the same model label, dataset, split and method under
    another digest reads here why they were recomputed (:meth:`ResultsStore.superseded`).
``explanations``
    (run, example_id) -> ``Explanation.to_json()``.
``measurements``
    (run, source, protocol_hash, example_id) -> raw perturbation measurements of one example
    (``source`` = ``remove`` / ``keep`` / ``loo``) as JSON, so that a further metric on the same
    curves needs no forward pass.
``metrics``
    (run, metric, protocol_hash, example_id) -> ``value``, ``curve`` (JSON list) and ``extra``
    (JSON) of one example.
``costs``
    per run: examples explained, seconds, forward and backward passes, peak memory --
    accumulated over the interrupted runs of that key only.
``protocols``
    protocol_hash -> the protocol's fields (JSON), for reading a store without heedful's presets.
``claims``
    (run, chunk) -> the process computing that bench task now (pid, host, when it last stored a
    step), so that another bench writing the store takes other tasks first; a claim whose process
    is gone (or silent for :data:`CLAIM_STALE` seconds) is taken over. Rows last only while a task
    runs; results never depend on them.

A store of schema 1 (heedful before method versions and fingerprints) opens without error: its
tables are kept, renamed ``schema1_*``, and never read (:attr:`ResultsStore.legacy` counts their
rows). Every write commits at once (WAL journal), and :meth:`ResultsStore.transaction` groups
the writes of one step of a bench task (a model batch explained or evaluated) into one commit, so
a run killed at any point loses at most the step in flight, never part of one, and the next run
computes only what is missing.

Several writers
---------------
Processes may write one store at once (two ``heedful bench`` runs on one ``--out``). A write
transaction takes the write lock when it begins (``BEGIN IMMEDIATE``), waiting for another
writer's commit (SQLite's busy timeout, then retries with backoff, :data:`LOCK_WAIT` seconds in
all) instead of failing with "database is locked"; readers never wait (WAL). Writes are
idempotent: a row whose key is stored is not replaced (``INSERT OR IGNORE``), it is compared with
the stored one on the values of :data:`ROW_VALUES` (what ``heedful bench merge`` compares too),
and ``written`` counts only the rows this object added (``differing``: rows whose stored copy
differs, kept as stored). A cost record adds up only the explanations a write added.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedful.engine.options import canonical_json
from heedful.errors import HeedfulError
from heedful.explanation import Explanation
from heedful.fingerprint import DIGITS, ModelFingerprint, dataset_fingerprint, model_fingerprint

if TYPE_CHECKING:
    from heedful.datasets import Dataset
    from heedful.model import Model

FILE_NAME = "results.sqlite"
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    run TEXT, model TEXT, dataset TEXT, split TEXT, method TEXT, options TEXT, given TEXT,
    version INTEGER, setting TEXT, model_fingerprint TEXT, model_parts TEXT, dataset_fingerprint TEXT,
    created REAL, PRIMARY KEY (run, model, dataset));
CREATE TABLE IF NOT EXISTS explanations (
    run TEXT, example_id TEXT, explanation TEXT NOT NULL, created REAL,
    PRIMARY KEY (run, example_id));
CREATE TABLE IF NOT EXISTS measurements (
    run TEXT, example_id TEXT, source TEXT, protocol_hash TEXT, data TEXT NOT NULL, created REAL,
    PRIMARY KEY (run, source, protocol_hash, example_id));
CREATE TABLE IF NOT EXISTS metrics (
    run TEXT, example_id TEXT, metric TEXT, protocol_hash TEXT, value REAL, curve TEXT, extra TEXT,
    created REAL, PRIMARY KEY (run, metric, protocol_hash, example_id));
CREATE TABLE IF NOT EXISTS costs (
    run TEXT PRIMARY KEY, examples INTEGER, seconds REAL, forward REAL, backward REAL, peak_mb REAL);
CREATE TABLE IF NOT EXISTS protocols (protocol_hash TEXT PRIMARY KEY, name TEXT, fields TEXT);
CREATE TABLE IF NOT EXISTS claims (run TEXT, chunk TEXT, pid INTEGER, host TEXT, seen REAL, PRIMARY KEY (run, chunk));
"""

ROW_VALUES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # table: (key columns, values compared: SQL of a row ``{r}``); an explanation's wall seconds
    # vary from one computation of it to the next, and how its tokens are written changed when
    # raw_tokens were kept apart (the tokenizer, fingerprinted in the key, decides them)
    "explanations": (
        ("run", "example_id"),
        (
            "CASE WHEN json_valid({r}.explanation) THEN json_remove({r}.explanation, '$.cost.seconds', '$.tokens', '$.raw_tokens') "
            "ELSE {r}.explanation END",
        ),
    ),
    "measurements": (("run", "source", "protocol_hash", "example_id"), ("{r}.data",)),
    "metrics": (("run", "metric", "protocol_hash", "example_id"), ("{r}.value", "{r}.curve", "{r}.extra")),
    "protocols": (("protocol_hash",), ("{r}.fields",)),
}
"""The tables whose rows must agree wherever their key is written twice (two writers of one
store, or two stores merged), by key."""

CLAIM_STALE = 600.0
"""Seconds after which a claim on a task that stored nothing is taken over even when its
process seems alive (a process on another host, or a hung one)."""

LOCK_WAIT = 600.0
"""Seconds a write waits in all for other writers of the store before a one-line error."""

_SCHEMA1_TABLES = ("explanations", "measurements", "metrics", "costs")
"""Tables whose rows schema 2 keys differently (a schema-1 store keeps them as ``schema1_<name>``)."""
_LEGACY_ROWS = {"explanations": "explanations", "measurements": "curve records", "metrics": "metric values"}
LEGACY_REASON = "written by an older heedful without method versions or fingerprints"


# ---------------------------------------------------------------------------- keys
@dataclass(frozen=True)
class Subject:
    """What runs explain: a loaded model and a dataset split, each by a readable label (zoo name
    or folder path; dataset name or file path) and by the fingerprint of its content."""

    model: str
    model_fingerprint: ModelFingerprint
    dataset: str
    dataset_fingerprint: str
    split: str


def model_label(model: Model) -> str:
    """How a model is named in the store: its zoo name, its folder's absolute path, or else the
    name it was loaded by (a hub id, or the name given to :func:`heedful.from_pretrained_objects`)."""
    if model.info.get("name") == model.name:  # a zoo model (heedful.load keeps its zoo entry)
        return model.name
    folder = Path(model.name).expanduser()
    return str(folder.resolve()) if folder.is_dir() else model.name


def dataset_label(dataset: str) -> str:
    """How a dataset is named in the store: a file's absolute path, else its name."""
    return str(Path(dataset).resolve()) if Path(dataset).exists() else dataset


def subject(
    model: Model,
    dataset: str,
    split: str,
    data: Dataset | None = None,
    *,
    label: str | None = None,
    dataset_options: Mapping[str, Any] | None = None,
) -> Subject:
    """The :class:`Subject` of ``model`` on ``dataset``'s ``split``. ``data``: the whole split as
    loaded (loaded here with ``dataset_options`` when not given); ``label``: the model's label
    (default :func:`model_label`)."""
    if data is None:
        from heedful import datasets

        data = datasets.load(dataset, split, None, **dict(dataset_options or {}))
    return Subject(label or model_label(model), model_fingerprint(model), dataset_label(dataset), dataset_fingerprint(data), split)


@dataclass(frozen=True)
class RunKey:
    """Which explanations: a method with its complete options and version, for a model and a
    dataset split (labels and fingerprints), under an explanation setting. Build it with
    :func:`run_key`. ``options`` and ``setting`` are canonical JSON; ``given`` names the options
    the caller set (the rest were defaults), for saying why rows were recomputed."""

    model: str
    dataset: str
    split: str
    method: str
    options: str
    version: int
    model_fingerprint: ModelFingerprint
    dataset_fingerprint: str
    setting: str
    given: tuple[str, ...] = field(default=(), compare=False)

    @cached_property
    def digest(self) -> str:
        """What rows are keyed by: everything above that decides the result (labels and
        ``given`` are readable only, so the same model reached by another name shares rows)."""
        identity = {
            "method": self.method,
            "options": self.options,
            "version": self.version,
            "model": self.model_fingerprint.digest,
            "dataset": self.dataset_fingerprint,
            "split": self.split,
            "setting": self.setting,
        }
        return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:DIGITS]

    def changes(self, before: RunKey) -> list[str]:
        """Why ``before``'s explanations do not serve this key, in words
        (``["default n_steps 50 -> 40", "model weights changed"]``)."""
        found = []
        if before.version != self.version:
            found.append(f"method version {before.version} -> {self.version}")
        old, new = json.loads(before.options), json.loads(self.options)
        for name in dict.fromkeys([*new, *old]):
            if old.get(name, _ABSENT) != new.get(name, _ABSENT):
                default = name not in self.given and name not in before.given
                found.append(f"{'default ' if default else ''}{name} {_shown(old, name)} -> {_shown(new, name)}")
        found += self.model_fingerprint.changes(before.model_fingerprint)
        if before.dataset_fingerprint != self.dataset_fingerprint:
            found.append("dataset changed")
        old, new = json.loads(before.setting), json.loads(self.setting)
        found += [f"{k} {_shown(old, k)} -> {_shown(new, k)}" for k in dict.fromkeys([*new, *old]) if old.get(k) != new.get(k)]
        return found


_ABSENT = object()


def _shown(values: dict[str, Any], name: str, width: int = 40) -> str:
    if name not in values:
        return "(absent)"
    text = json.dumps(values[name])
    return text if len(text) <= width else text[: width - 3] + "..."


def run_key(
    subject: Subject,
    method: str,
    options: Mapping[str, Any] | None = None,
    *,
    label: str = "predicted",
    max_length: int | None = None,
    lm_word: str = "target",
) -> RunKey:
    """The key of ``method`` run with ``options`` (the caller's; bound here, so defaults enter
    the key and bad options fail with an :class:`~heedful.InputError`) on ``subject``, explaining
    the ``label`` choice (``"predicted"`` / ``"gold"``) with inputs cut to ``max_length`` tokens
    (``lm_word``: which word of language-model data is explained)."""
    from heedful.attribution import get_method

    info = get_method(method)
    given = dict(options or {})
    return RunKey(
        model=subject.model,
        dataset=subject.dataset,
        split=subject.split,
        method=info.name,
        options=canonical_json(info.key_options(info.bind(given))),
        version=info.version,
        model_fingerprint=subject.model_fingerprint,
        dataset_fingerprint=subject.dataset_fingerprint,
        setting=canonical_json({"label": label, "max_length": max_length, "lm_word": lm_word}),
        given=tuple(sorted(given)),
    )


@dataclass(frozen=True)
class Superseded:
    """Stored explanations of another key that a run recomputes: ``count`` of the run's examples
    were explained under ``before``; ``reasons`` say what changed."""

    count: int
    before: RunKey
    reasons: list[str]

    def describe(self, label: str) -> str:
        """``integrated_gradients: 200 explanations recomputed (default n_steps 50 -> 40)``."""
        return f"{label}: {self.count} explanations recomputed ({', '.join(self.reasons) or 'key changed'})"


# ---------------------------------------------------------------------------- JSON
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


# ---------------------------------------------------------------------------- the store
class ResultsStore:
    """A results store in ``folder/results.sqlite`` (or at a ``.sqlite`` file path).

    ``written`` counts rows written by this object per table -- a resumed run that finds
    everything stored writes none. ``legacy`` counts the rows of a schema-1 store that are kept
    but never read (table -> rows).

    >>> store = ResultsStore(tmp_path)                                      # doctest: +SKIP
    >>> store.explanation_ids(run_key(subject(model, "movies", "test"), "saliency"))  # doctest: +SKIP
    set()
    """

    def __init__(self, path: str | Path, timeout: float = LOCK_WAIT) -> None:
        """``timeout``: seconds a write waits in all for other processes' write locks before a
        one-line :class:`~heedful.HeedfulError` (as are a corrupt file and another program's
        database)."""
        path = Path(path)
        try:
            if path.suffix not in (".sqlite", ".db"):
                path.mkdir(parents=True, exist_ok=True)
                path = path / FILE_NAME
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HeedfulError(
                f"cannot create the results store folder {path}: {exc.strerror or exc}", hint="give a folder you can write to"
            ) from None
        self.path, self.timeout = path, timeout
        if path.is_dir():
            raise HeedfulError(f"the results store {path} is a directory", hint="give the folder that holds it, or a new folder")
        try:
            # autocommit: every transaction is begun explicitly, taking the write lock at once
            self.db = sqlite3.connect(path, timeout=min(timeout, 30.0), isolation_level=None)
            _check_database(self.db, path)
            self._waiting("PRAGMA journal_mode=WAL")
            self._open_schema()
        except sqlite3.OperationalError as exc:
            raise _store_error(path, exc) from None
        except sqlite3.DatabaseError as exc:
            raise HeedfulError(f"cannot open the results store {path}: {exc}", hint="use a new --out folder") from None
        self.legacy = self._legacy_counts()
        self.written = {"explanations": 0, "measurements": 0, "metrics": 0}
        self.differing = {"explanations": 0, "measurements": 0, "metrics": 0}
        self._registered: set[tuple[str, str, str]] = set()
        self._in_transaction = False

    def _open_schema(self) -> None:
        """Create schema 2; a schema-1 store's tables are renamed ``schema1_*`` first (one
        transaction, so two processes opening it at once migrate it once)."""
        self._waiting("BEGIN IMMEDIATE")
        self.db.execute("CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT)")
        row = self.db.execute("SELECT value FROM info WHERE key='schema'").fetchone()
        found = SCHEMA_VERSION if row is None else int(row[0])
        if found > SCHEMA_VERSION:
            self.db.rollback()
            raise HeedfulError(
                f"{self.path} was written by a newer heedful (schema {found})",
                hint="upgrade heedful or use a new --out folder",
            )
        if found < SCHEMA_VERSION:
            present = self._tables()
            for table in (t for t in _SCHEMA1_TABLES if t in present):
                self.db.execute(f"ALTER TABLE {table} RENAME TO schema1_{table}")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self.db.execute(statement)
        self.db.execute("INSERT OR REPLACE INTO info VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self.db.commit()

    def _tables(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _legacy_counts(self) -> dict[str, int]:
        tables = self._tables()
        counts = {t: self.db.execute(f"SELECT COUNT(*) FROM schema1_{t}").fetchone()[0] for t in _LEGACY_ROWS if f"schema1_{t}" in tables}
        return {t: n for t, n in counts.items() if n}

    def legacy_note(self) -> str | None:
        """What a schema-1 store holds that is left unused, and why (``None`` when nothing)."""
        parts = [f"{n} {_LEGACY_ROWS[t]}" for t, n in self.legacy.items()]
        if not parts:
            return None
        return f"{self.path}: {', '.join(parts)} left unused ({LEGACY_REASON})"

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[ResultsStore]:
        """Every write inside is one SQLite transaction: committed together at the end, or none
        of them when an exception (or a killed process) stops it. Nested uses join the outer one.

        >>> with store.transaction():                                     # doctest: +SKIP
        ...     store.put_explanations(key, rows); store.put_metrics(key, "aopc", phash, values)
        """
        if self._in_transaction:
            yield self
            return
        registered, written, differing = set(self._registered), dict(self.written), dict(self.differing)
        self._waiting("BEGIN IMMEDIATE")
        self._in_transaction = True
        try:
            yield self
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            self._registered, self.written, self.differing = registered, written, differing
            raise
        finally:
            self._in_transaction = False

    def _writing(self):
        """The context of one write: its own transaction, or the open :meth:`transaction`'s."""
        return nullcontext() if self._in_transaction else self.transaction()

    def _waiting(self, statement: str) -> None:
        """Run ``statement`` (one that takes a lock), waiting for other writers: SQLite's busy
        timeout, then retries with a growing pause, ``timeout`` seconds in all."""
        deadline, pause = time.monotonic() + self.timeout, 0.05
        while True:
            try:
                self.db.execute(statement)
                return
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() + pause > deadline:
                    raise _store_error(self.path, exc) from None
                time.sleep(pause)
                pause = min(2 * pause, 2.0)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ runs
    def _register(self, key: RunKey) -> None:
        """Record ``key``'s readable columns (once per digest and labels)."""
        ident = (key.digest, key.model, key.dataset)
        if ident in self._registered:
            return
        fp = key.model_fingerprint
        with self._writing():
            self.db.execute(
                "INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    key.digest, key.model, key.dataset, key.split, key.method, key.options, json.dumps(list(key.given)),
                    key.version, key.setting, fp.digest, json.dumps(fp.to_dict()), key.dataset_fingerprint, time.time(),
                ),
            )
        self._registered.add(ident)

    def _key(self, row: Sequence[Any]) -> RunKey:
        model, dataset, split, method, options, given, version, setting, parts, data_fp = row
        return RunKey(
            model, dataset, split, method, options, int(version), ModelFingerprint.from_dict(json.loads(parts)),
            data_fp, setting, tuple(json.loads(given)),
        )

    def superseded(self, key: RunKey, ids: Collection[str], current: Collection[str] = ()) -> Superseded | None:
        """Explanations of ``ids`` stored for the same model label, dataset, split and method
        under another key (not ``key`` and none of the ``current`` digests of this run): the
        closest such key (fewest changes, then the latest written) and why it differs."""
        wanted = set(ids)
        if not wanted:
            return None
        rows = self.db.execute(
            "SELECT run, model, dataset, split, method, options, given, version, setting, model_parts, dataset_fingerprint"
            " FROM runs WHERE model=? AND dataset=? AND split=? AND method=?",
            (key.model, key.dataset, key.split, key.method),
        ).fetchall()
        skip = {key.digest, *current}
        best: tuple[tuple[int, float], Superseded] | None = None
        for run, *rest in rows:
            if run in skip:
                continue
            found = self.db.execute("SELECT example_id, created FROM explanations WHERE run=?", (run,)).fetchall()
            count = sum(1 for ident, _ in found if ident in wanted)
            if not count:
                continue
            before = self._key(rest)
            reasons = key.changes(before)
            rank = (len(reasons), -max(created for _, created in found))
            if best is None or rank < best[0]:
                best = (rank, Superseded(count, before, reasons))
        return None if best is None else best[1]

    # ------------------------------------------------------------------ rows
    def _select(
        self, table: str, columns: str, key: RunKey, ids: Sequence[str] | None = None, **where: str
    ) -> list[tuple]:
        """``(example_id, *columns)`` rows of ``table`` under ``key`` (and ``where``: column ->
        value), only those of ``ids`` when given."""
        clause = "".join(f" AND {column}=?" for column in where)
        params: tuple = (key.digest, *where.values())
        if ids is not None and len(ids) <= 500:  # a few rows of a large run: look them up
            clause += f" AND example_id IN ({','.join('?' * len(ids))})"
            params += tuple(ids)
        rows = self.db.execute(
            f"SELECT example_id{', ' + columns if columns else ''} FROM {table} WHERE run=?{clause}", params
        )
        wanted = None if ids is None else set(ids)
        return [row for row in rows if wanted is None or row[0] in wanted]

    def _insert(self, table: str, key: RunKey, rows: list[tuple]) -> int:
        """Write ``(run, example_id, ...)`` rows of ``table`` in one transaction, keeping a row
        whose key is stored (another writer's); count the rows added and the stored ones that
        differ on :data:`ROW_VALUES`. Returns the rows added."""
        self._register(key)
        if not rows:
            return 0
        keys, values = ROW_VALUES[table]
        on = " AND ".join(f"a.{k} = b.{k}" for k in keys)
        differs = " OR ".join(f"{v.format(r='a')} IS NOT {v.format(r='b')}" for v in values)
        with self._writing():
            self.db.execute(f"CREATE TEMP TABLE IF NOT EXISTS incoming_{table} AS SELECT * FROM main.{table} WHERE 0")
            self.db.executemany(f"INSERT INTO temp.incoming_{table} VALUES ({','.join('?' * len(rows[0]))})", rows)
            present, differing = self.db.execute(
                f"SELECT COUNT(*), COALESCE(SUM({differs}), 0) FROM temp.incoming_{table} a JOIN main.{table} b ON {on}"
            ).fetchone()
            self.db.execute(f"INSERT OR IGNORE INTO main.{table} SELECT * FROM temp.incoming_{table}")
            self.db.execute(f"DELETE FROM temp.incoming_{table}")
            self.written[table] += len(rows) - present
            self.differing[table] += differing
        return len(rows) - present

    # ------------------------------------------------------------------ explanations
    def explanation_ids(self, key: RunKey, ids: Sequence[str] | None = None) -> set[str]:
        """Ids explained under ``key`` (of ``ids`` only, when given)."""
        return {row[0] for row in self._select("explanations", "", key, ids)}

    def put_explanations(self, key: RunKey, items: Iterable[tuple[str, Explanation]]) -> int:
        return self.put_explanation_texts(key, [(ident, expl.to_json()) for ident, expl in items])

    def put_explanation_texts(self, key: RunKey, items: Iterable[tuple[str, str]]) -> int:
        """Store ``(example_id, Explanation.to_json())`` rows (made elsewhere, e.g. by a worker);
        returns how many were not stored before."""
        now = time.time()
        return self._insert("explanations", key, [(key.digest, ident, text, now) for ident, text in items])

    def explanation_texts(self, key: RunKey, ids: Sequence[str] | None = None) -> dict[str, str]:
        """``example_id -> Explanation.to_json()`` as stored (for sending to another process)."""
        return dict(self._select("explanations", "explanation", key, ids))

    def get_explanations(self, key: RunKey, ids: Sequence[str] | None = None) -> dict[str, Explanation]:
        rows = self._select("explanations", "explanation", key, ids)
        return {ident: Explanation.from_dict(json.loads(text)) for ident, text in rows}

    def explanation_costs(self, key: RunKey, ids: Sequence[str] | None = None) -> dict[str, tuple[float, float]]:
        """``example_id -> (forward, backward)`` passes as each stored explanation records its cost
        (the mean per example of the batch it was explained in), read without decoding the
        explanations; explanations stored without a cost are left out."""
        columns = "json_extract(explanation, '$.cost.forward_passes'), json_extract(explanation, '$.cost.backward_passes')"
        return {ident: (float(f), float(b or 0.0)) for ident, f, b in self._select("explanations", columns, key, ids) if f is not None}

    # ------------------------------------------------------------------ raw measurements
    def measurement_ids(self, key: RunKey, source: str, protocol_hash: str, ids: Sequence[str] | None = None) -> set[str]:
        return {row[0] for row in self._select("measurements", "", key, ids, source=source, protocol_hash=protocol_hash)}

    def put_measurements(self, key: RunKey, source: str, protocol_hash: str, items: Iterable[tuple[str, dict]]) -> None:
        now = time.time()
        rows = [(key.digest, ident, source, protocol_hash, _json(data), now) for ident, data in items]
        self._insert("measurements", key, rows)

    def get_measurements(self, key: RunKey, source: str, protocol_hash: str, ids: Sequence[str] | None = None) -> dict[str, dict]:
        rows = self._select("measurements", "data", key, ids, source=source, protocol_hash=protocol_hash)
        return {ident: {k: _nan(v) for k, v in json.loads(text).items()} for ident, text in rows}

    # ------------------------------------------------------------------ metric values
    def metric_ids(self, key: RunKey, metric: str, protocol_hash: str, ids: Sequence[str] | None = None) -> set[str]:
        return {row[0] for row in self._select("metrics", "", key, ids, metric=metric, protocol_hash=protocol_hash)}

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
                key.digest, ident, metric, protocol_hash,
                float(value) if value is not None and math.isfinite(value) else None,
                None if curve is None else _json(list(curve)),
                None if extra is None else _json(extra),
                now,
            )
            for ident, value, curve, extra in items
        ]
        self._insert("metrics", key, rows)

    def get_metrics(
        self, key: RunKey, metric: str, protocol_hash: str, ids: Sequence[str] | None = None
    ) -> dict[str, tuple[float, list[float] | None, dict | None]]:
        """``example_id -> (value, curve, extra)`` (NaN for undefined values)."""
        rows = self._select("metrics", "value, curve, extra", key, ids, metric=metric, protocol_hash=protocol_hash)
        return {
            ident: (
                float("nan") if value is None else float(value),
                None if curve is None else _nan(json.loads(curve)),
                None if extra is None else {k: _nan(v) for k, v in json.loads(extra).items()},
            )
            for ident, value, curve, extra in rows
        }

    def record_explained(self, key: RunKey, items: Sequence[tuple[str, Explanation]], seconds: float, peak_mb: float) -> None:
        """Store freshly computed explanations and add what they cost: ``seconds`` of wall time,
        their forward and backward passes, and the process's peak memory ``peak_mb`` (the share
        of those another writer had not stored already)."""
        with self.transaction():
            added = self.put_explanations(key, items)
            self.add_cost(
                key, len(items), seconds, sum(e.cost.forward_passes for _, e in items),
                sum(e.cost.backward_passes for _, e in items), peak_mb, added,
            )

    # ------------------------------------------------------------------ costs and protocols
    def add_cost(
        self, key: RunKey, examples: int, seconds: float, forward: float, backward: float, peak_mb: float, added: int | None = None
    ) -> None:
        """Add to ``key``'s cost record (interrupted runs of one key add up; another key -- a
        recomputation -- starts its own record) what ``examples`` explanations cost, or the share
        of it of the ``added`` ones a write stored (the others were stored by another writer, who
        counted them)."""
        if added is not None and added < examples:
            if not added:
                return
            share = added / examples
            examples, seconds, forward, backward = added, seconds * share, forward * share, backward * share
        self._register(key)
        with self._writing():
            self.db.execute(
                "INSERT INTO costs VALUES (?,?,?,?,?,?) ON CONFLICT (run) DO UPDATE SET"
                " examples = examples + excluded.examples, seconds = seconds + excluded.seconds,"
                " forward = forward + excluded.forward, backward = backward + excluded.backward,"
                " peak_mb = max(coalesce(peak_mb, 0), excluded.peak_mb)",
                (key.digest, examples, seconds, forward, backward, peak_mb),
            )

    def cost(self, key: RunKey) -> dict[str, float] | None:
        """Totals for a run: examples, seconds, forward / backward passes, peak memory (MB)."""
        row = self.db.execute("SELECT examples, seconds, forward, backward, peak_mb FROM costs WHERE run=?", (key.digest,)).fetchone()
        if row is None:
            return None
        return dict(zip(("examples", "seconds", "forward", "backward", "peak_mb"), row, strict=True))

    def run_keys(self) -> list[tuple[RunKey, float]]:
        """Every run key the store has rows of, with when it was first written (oldest first)."""
        rows = self.db.execute(
            "SELECT model, dataset, split, method, options, given, version, setting, model_parts, dataset_fingerprint, created"
            " FROM runs ORDER BY created"
        ).fetchall()
        return [(self._key(row[:-1]), float(row[-1])) for row in rows]

    def metric_counts(self, key: RunKey) -> list[tuple[str, str, int]]:
        """``(metric, protocol_hash, examples)`` of every metric stored under ``key``."""
        return self.db.execute(
            "SELECT metric, protocol_hash, COUNT(*) FROM metrics WHERE run=? GROUP BY metric, protocol_hash ORDER BY metric",
            (key.digest,),
        ).fetchall()

    def protocol(self, protocol_hash: str) -> tuple[str, dict] | None:
        """The name and fields stored for ``protocol_hash`` (``None`` when not stored)."""
        row = self.db.execute("SELECT name, fields FROM protocols WHERE protocol_hash=?", (protocol_hash,)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def protocols(self, name: str) -> dict[str, dict]:
        """Every protocol stored under ``name``: its hash -> its fields."""
        rows = self.db.execute("SELECT protocol_hash, fields FROM protocols WHERE name=?", (name,)).fetchall()
        return {row[0]: json.loads(row[1]) for row in rows}

    def metric_total(self, metric: str, protocol_hash: str, model_fingerprint: str) -> int:
        """How many values of ``metric`` under ``protocol_hash`` the store holds over every run of
        the model whose fingerprint digest is ``model_fingerprint``."""
        return self.db.execute(
            "SELECT COUNT(*) FROM metrics JOIN runs ON metrics.run = runs.run"
            " WHERE metrics.metric=? AND metrics.protocol_hash=? AND runs.model_fingerprint=?",
            (metric, protocol_hash, model_fingerprint),
        ).fetchone()[0]

    # ------------------------------------------------------------------ claims of bench tasks
    def claim(self, run: str, chunk: str) -> bool:
        """Claim the task of run digest ``run`` on the chunk starting at example ``chunk`` for this
        process: ``False`` when another process holds it (see ``claims`` in the module docstring)."""
        with self.transaction():
            row = self.db.execute("SELECT pid, host, seen FROM claims WHERE run=? AND chunk=?", (run, chunk)).fetchone()
            if row is not None and _claim_alive(*row):
                return False
            self.db.execute("INSERT OR REPLACE INTO claims VALUES (?,?,?,?,?)", (run, chunk, os.getpid(), _HOST, time.time()))
        return True

    def touch(self, run: str, chunk: str) -> None:
        """Mark this process's claim on a task as alive (after each stored step)."""
        with self._writing():
            self.db.execute("UPDATE claims SET seen=? WHERE run=? AND chunk=? AND pid=? AND host=?", (time.time(), run, chunk, os.getpid(), _HOST))

    def release(self, run: str, chunk: str) -> None:
        """Drop this process's claim on a task (done, or given up)."""
        with self._writing():
            self.db.execute("DELETE FROM claims WHERE run=? AND chunk=? AND pid=? AND host=?", (run, chunk, os.getpid(), _HOST))

    def put_protocol(self, protocol_hash: str, name: str, fields: dict) -> None:
        with self._writing():
            self.db.execute("INSERT OR IGNORE INTO protocols VALUES (?,?,?)", (protocol_hash, name, _json(fields)))


def _check_database(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged file (SQLite's quick check) and a database of another program (tables,
    but no heedful schema record), before anything is written to it."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check(1)")]
    if problems != ["ok"]:
        raise HeedfulError(f"the results store {path} is damaged ({problems[0]})", hint="move it aside and rerun: the run starts a new store")
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    ours = "info" in tables and db.execute("SELECT 1 FROM info WHERE key='schema'").fetchone() is not None
    if tables and not ours:
        raise HeedfulError(
            f"{path} is an SQLite database of another program, not a heedful results store",
            hint="give a new --out / --store folder",
        )


_HOST = socket.gethostname()


def _claim_alive(pid: int, host: str, seen: float) -> bool:
    """Whether a claim is held by a live process: one that stored a step within
    :data:`CLAIM_STALE` seconds and, on this host, is running and not this process (whose own
    claims at a check are left over by an earlier process of the same id)."""
    if time.time() - seen > CLAIM_STALE:
        return False
    if host != _HOST:
        return True
    if pid == os.getpid():
        return False
    if os.name == "nt":  # os.kill would end the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _store_error(path: Path, exc: sqlite3.OperationalError) -> HeedfulError:
    """A one-line error for SQLite's operational failures: a lock held by another run, a
    read-only or vanished file."""
    text = str(exc)
    if _is_locked(exc):
        return HeedfulError(f"the results store {path} is locked by another process", hint="wait for the other run to finish, or use another --out / --store folder")
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return HeedfulError(f"cannot write the results store {path} ({text})", hint="give a folder you can write to")
    return HeedfulError(f"cannot use the results store {path}: {text}", hint="use a new --out / --store folder")
