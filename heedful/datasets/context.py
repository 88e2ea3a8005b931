"""Context data: long documents with a query, the continuation to explain, and (where known)
the source that holds the answer -- the data of context attribution (which sentence of the
context did the model use?).

Every context example is an :class:`~heedful.datasets.Example` of a :class:`Dataset` with
``task="context"``:

* ``text``: the prompt the model reads, ``context + "\\n\\n" + query``;
* ``target``: the continuation explained, exactly as written (a leading space included:
  ``" Paris"``); one token is the next-token target, several a span target; ``None``: the
  model's predicted next token;
* ``evidence_spans``: ``((0, start, end),)``, the answer's character span in ``text`` when known
  (what token precision@k compares with);
* ``meta[CONTEXT]``: ``[0, len(context)]``, the region of ``text`` that is context (the query is
  never a source); ``meta[SOURCES]``: the sources as ``[start, end]`` character spans of
  ``text`` when the data fixes them (the planted set, :mod:`heedful.datasets.planted`), else
  absent: the sources are then the context's sentences (:mod:`heedful.engine.sources`, cut by the
  evaluation layer); ``meta[ANSWER_SOURCE]``: index of the source that holds the answer, when
  known.

:func:`load_context_file` reads the user's JSON-lines file of such examples:

==================  ========  ================================================================
field               needed    meaning
==================  ========  ================================================================
``context``         yes       the document (its sentences are the sources)
``query``           yes       what is asked of it (follows the context after a blank line)
``target``          no        the continuation to explain, as written (default: the model's
                              predicted next token)
``answer_source``   no        index of the context sentence that holds the answer (0-based;
                              sentences as :func:`heedful.engine.sources.split_text` cuts them)
``answer_span``     no        ``[start, end]`` character span of the answer in ``context``
``id``              no        example id (default: the row number); ids must be unique
``split``           no        keep only the rows whose split matches the split asked for
==================  ========  ================================================================

A row may give ``answer_source`` or ``answer_span`` or both (top-k source accuracy reads the
first -- or, without it, the sentence the span starts in -- and token precision@k the second --
or, without it, the whole answer sentence). ``answer_source`` is checked against the number of
sentences when the examples meet a model, before any work.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import numpy as np

from heedful.datasets.examples import Dataset, Example
from heedful.datasets.user import read_table, rows_of_split
from heedful.errors import InputError

CONTEXT = "context"
SOURCES = "sources"
ANSWER_SOURCE = "answer_source"
SEPARATOR = "\n\n"
"""What joins the context and the query."""
FIELDS = ("context", "query", "target", "answer_source", "answer_span", "id", "split")


def is_context_file(path: str | Path) -> bool:
    """Whether ``path`` is a JSON-lines (or JSON) file of context data: its first record has
    ``context`` and ``query`` fields and no ``text`` (read from its first line only)."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json") or not path.is_file():
        return False
    with open(path, encoding="utf-8") as fh:
        head = fh.read(1 << 16)
    first = next((line for line in head.splitlines() if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        try:  # a JSON list of records
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return False
        record = data[0] if isinstance(data, list) and data else {}
    return isinstance(record, dict) and {"context", "query"} <= set(record) and "text" not in record


def context_example(
    ident: str,
    context: str,
    query: str,
    target: str | None = None,
    *,
    answer_source: int | None = None,
    answer_span: tuple[int, int] | None = None,
    sources: list[tuple[int, int]] | None = None,
    meta: dict[str, Any] | None = None,
) -> Example:
    """One context example (see the module docstring): ``answer_span`` and ``sources`` are
    character spans of ``context`` (the same offsets in the prompt, which starts with it)."""
    text = context + SEPARATOR + query
    data: dict[str, Any] = {CONTEXT: [0, len(context)]}
    if sources is not None:
        data[SOURCES] = [list(s) for s in sources]
    if answer_source is not None:
        data[ANSWER_SOURCE] = int(answer_source)
    data.update(meta or {})
    spans = () if answer_span is None else ((0, int(answer_span[0]), int(answer_span[1])),)
    words = tuple(text[s:e] for _, s, e in spans)
    return Example(id=ident, text=text, target=target, evidence=words, evidence_spans=spans, meta=data)


def _text(value: Any, name: str, row: int, path: Path, needed: bool) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        if needed:
            raise InputError(f"row {row} of {path} has no {name}", hint=f"every row needs a non-empty '{name}'")
        return None
    if not isinstance(value, str):
        raise InputError(f"row {row} of {path}: {name} must be text, got {json.dumps(value)[:40]}")
    if needed and not value.strip():
        raise InputError(f"row {row} of {path} has an empty {name}", hint=f"every row needs a non-empty '{name}'")
    return value


def _answer_source(value: Any, row: int, path: Path) -> int | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Number) or not float(value).is_integer() or value < 0:
        raise InputError(
            f"row {row} of {path}: answer_source must be a sentence index (0, 1, ...), got {json.dumps(value)[:40]}"
        )
    return int(value)


def _answer_span(value: Any, context: str, row: int, path: Path) -> tuple[int, int] | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, numbers.Number) and not isinstance(v, bool | np.bool_) and float(v).is_integer() for v in value)
    )
    if not ok:
        raise InputError(f"row {row} of {path}: answer_span must be [start, end] character offsets, got {json.dumps(value)[:40]}")
    start, end = int(value[0]), int(value[1])
    if not 0 <= start < end <= len(context):
        raise InputError(
            f"row {row} of {path}: answer_span {[start, end]} is outside the context ({len(context)} characters)",
            hint="give 0 <= start < end <= len(context)",
        )
    return start, end


def load_context_file(path: str | Path, split: str | None = None, name: str | None = None) -> Dataset:
    """Read the user's JSON-lines file of context examples (see the module docstring); a bad row
    is a one-line :class:`~heedful.InputError` naming the row and the field."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"no such data file: {path}", hint="give a JSON-lines file with 'context' and 'query' fields")
    frame = read_table(path)
    missing = [c for c in ("context", "query") if c not in frame.columns]
    if missing:
        raise InputError(f"{path} has no '{missing[0]}' field", hint="each line needs {\"context\": ..., \"query\": ...}")
    unknown = sorted(set(map(str, frame.columns)) - set(FIELDS))
    if unknown:
        raise InputError(f"{path}: unknown field {unknown[0]!r}", hint=f"context data fields: {', '.join(FIELDS)}")
    frame = rows_of_split(frame, split, path)
    examples: list[Example] = []
    seen: set[str] = set()
    for row, record in enumerate(frame.to_dict("records")):
        context = _text(record.get("context"), "context", row, path, True)
        query = _text(record.get("query"), "query", row, path, True)
        target = _text(record.get("target"), "target", row, path, False)
        if target is not None and not target.strip():
            raise InputError(f"row {row} of {path} has an empty target", hint="give the continuation to explain, or leave 'target' out")
        raw_id = record.get("id")
        ident = str(row) if raw_id is None or (isinstance(raw_id, float) and raw_id != raw_id) else str(raw_id)
        if ident in seen:
            raise InputError(f"{path}: example id {ident!r} occurs twice", hint="ids must be unique")
        seen.add(ident)
        examples.append(
            context_example(
                ident, context, query, target,
                answer_source=_answer_source(record.get("answer_source"), row, path),
                answer_span=_answer_span(record.get("answer_span"), context, row, path),
            )
        )
    if not examples:
        raise InputError(f"{path} has no examples")
    return Dataset(
        name=name or path.stem,
        split=split or "all",
        examples=examples,
        task="context",
        evidence_source="user-provided answer spans" if any(e.evidence_spans for e in examples) else None,
        description=f"user context data from {path}",
    )
