"""The user's own data: a CSV or JSON-lines file of texts with optional labels and evidence.

Columns (CSV header or JSON keys):

==============  ========  ==============================================================
column          needed    meaning
==============  ========  ==============================================================
``text``        yes       the text to explain
``text_pair``   no        a second segment (NLI premise / hypothesis, QA question ...)
``label``       no        gold class: an index (``0``) or a label name (``POSITIVE``)
``rating``      no        gold value for regression models
``evidence``    no        evidence words, found as whole words in ``text`` (and
                          ``text_pair``): a JSON list (``["dull", "boring"]``) or, in CSV,
                          words separated by ``|`` (``dull|boring``); in JSONL also a list of
                          ``[start, end]`` character spans of ``text``
``id``          no        example id (default: the row number); ids must be unique
``split``       no        keep only the rows whose split matches the split asked for
==============  ========  ==============================================================

``target`` / ``foil`` columns (a word a language model should / should not predict at a
``[MASK]``-free position) are read too, for agreement-style data with ``target_start`` /
``target_end`` character offsets.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from heedful.datasets.evidence import word_spans
from heedful.datasets.examples import Dataset, Example, Span
from heedful.errors import InputError, close_matches

SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".ndjson")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` names a data file rather than a built-in dataset."""
    return name.lower().endswith(SUFFIXES) or "/" in name or Path(name).exists()


def read_table(path: Path) -> pd.DataFrame:
    """A CSV, TSV, JSON or JSON-lines file as a data frame (an :class:`InputError` when it cannot be read)."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            return pd.DataFrame(data if isinstance(data, list) else data.get("examples", data))
    except (ValueError, json.JSONDecodeError, pd.errors.ParserError) as exc:
        raise InputError(f"could not read {path}: {exc}", hint="check that the file is valid CSV / JSON lines") from exc
    raise InputError(f"{path} is not a CSV, TSV or JSON-lines file", hint=f"use one of: {', '.join(SUFFIXES)}")


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and value != value:
        return True
    return isinstance(value, str) and not value.strip()


def _label(value: Any) -> int | str | None:
    if _missing(value):
        return None
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Number) and float(value).is_integer():
        return int(value)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return text


def _evidence(value: Any, text: str, pair: str | None, row: int) -> tuple[tuple[str, ...], tuple[Span, ...]]:
    """Evidence words and spans from a list of words, a ``|``-separated string or [start, end] spans."""
    if not isinstance(value, list) and _missing(value):
        return (), ()
    items = value
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                items = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise InputError(f"row {row}: evidence {value!r} is not a JSON list", hint='write ["word", ...] or word|word') from exc
        else:
            items = [w.strip() for w in stripped.split("|") if w.strip()]
    if not isinstance(items, list):
        raise InputError(f"row {row}: evidence must be a list of words or spans, got {value!r}")
    if items and all(isinstance(i, list | tuple) and len(i) == 2 for i in items):
        spans = []
        for start, end in items:
            if not (0 <= int(start) < int(end) <= len(text)):
                raise InputError(f"row {row}: evidence span {[start, end]} is outside the text ({len(text)} characters)")
            spans.append((0, int(start), int(end)))
        return tuple(text[s:e] for _, s, e in spans), tuple(spans)
    words = tuple(str(w) for w in items)
    spans = word_spans(text, words, 0) + (word_spans(pair, words, 1) if pair else ())
    if words and not spans:
        commas = any("," in w or ";" in w for w in words)
        raise InputError(
            f"row {row}: none of the evidence words {list(words)} occurs in the text",
            hint="separate evidence words with | (dull|boring), not commas" if commas
            else "evidence words must appear in the text as whole words",
        )
    return words, spans


EVIDENCE_FORMAT = {
    "csv": "an 'evidence' column of words separated by | (dull|boring) or a JSON list ([\"dull\", \"boring\"])",
    "json": "an 'evidence' key: a list of words ([\"dull\", \"boring\"]) or of [start, end] character spans of text",
}
"""How evidence is written, per kind of file (docs/bench.md, "Your data")."""

EVIDENCE_LIKE = ("rationale", "rationales", "highlight", "highlights", "annotation", "annotations", "evidence_words")
"""Column names other datasets give evidence (ERASER's rationales, e-SNLI's highlights)."""


def evidence_hint(path: str | Path) -> str:
    """How to give plausibility evidence in the file ``path``: the column and its format for
    the file's kind, the file's columns (a column named like ``evidence`` called out)."""
    path = Path(path).expanduser()
    kind = "csv" if path.suffix.lower() in (".csv", ".tsv") else "json"
    try:
        columns = [str(c) for c in read_table(path).columns]
    except InputError:
        columns = []
    hint = f"add {EVIDENCE_FORMAT[kind]}"
    close = [c for c in columns if c.lower() in EVIDENCE_LIKE] or close_matches("evidence", [c for c in columns if c != "evidence"])
    if close:
        hint += f"; rename {close[0]!r} to 'evidence' if it holds them"
    elif columns:
        hint += f" (its columns: {', '.join(columns)})"
    return hint + "; see docs/bench.md, 'Your data'"


def rows_of_split(frame: pd.DataFrame, split: str | None, path: Path) -> pd.DataFrame:
    """The rows of ``split`` when the table has a ``split`` column (all rows otherwise); an
    :class:`InputError` when none is left."""
    if split is None or "split" not in frame.columns:
        return frame
    frame = frame[frame["split"].astype(str) == split]
    if frame.empty:
        raise InputError(f"{path} has no rows of split {split!r}")
    return frame


def load_file(path: str | Path, split: str | None = None, name: str | None = None) -> Dataset:
    """Read a user dataset (see the module docstring for the columns)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"no such data file: {path}", hint="give a CSV or JSON-lines file with a 'text' column")
    frame = read_table(path)
    if "text" not in frame.columns:
        raise InputError(f"{path} has no 'text' column", hint=f"columns found: {', '.join(map(str, frame.columns))}")
    frame = rows_of_split(frame, split, path)
    examples: list[Example] = []
    seen: set[str] = set()
    for row, record in enumerate(frame.to_dict("records")):
        text = record.get("text")
        if _missing(text):
            raise InputError(f"row {row} of {path} has an empty text", hint="every row needs a non-empty 'text'")
        text = str(text)
        pair = None if _missing(record.get("text_pair")) else str(record["text_pair"])
        ident = str(record["id"]) if not _missing(record.get("id")) else str(row)
        if ident in seen:
            raise InputError(f"{path}: example id {ident!r} occurs twice", hint="ids must be unique")
        seen.add(ident)
        rating = record.get("rating")
        words, spans = _evidence(record.get("evidence"), text, pair, row)
        target_span = None
        if not _missing(record.get("target_start")) and not _missing(record.get("target_end")):
            target_span = (int(record["target_start"]), int(record["target_end"]))
        examples.append(
            Example(
                id=ident,
                text=text,
                text_pair=pair,
                label=_label(record.get("label")),
                rating=None if _missing(rating) else float(rating),
                evidence=words,
                evidence_spans=spans,
                target=None if _missing(record.get("target")) else str(record["target"]),
                foil=None if _missing(record.get("foil")) else str(record["foil"]),
                target_span=target_span,
            )
        )
    if not examples:
        raise InputError(f"{path} has no examples")
    has_label = any(e.label is not None for e in examples)
    has_rating = any(e.rating is not None for e in examples)
    task = "sentiment" if has_label and has_rating else "classification" if has_label else "regression" if has_rating else "unlabelled"
    return Dataset(
        name=name or path.stem,
        split=split or "all",
        examples=examples,
        task=task,
        label_names=None,  # string labels are matched to a model's labels by name
        evidence_source="user-provided" if any(e.evidence_spans for e in examples) else None,
        description=f"user data from {path}",
    )
