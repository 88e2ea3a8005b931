"""Explanations computed elsewhere, read and aligned to a heedful model's tokens, so that every
metric and preset scores them exactly like heedful's own methods.

Readers
-------
* :func:`from_records` -- dicts (one per explanation) with the fields of :data:`FIELDS`;
* :func:`from_json` -- a JSON list of such dicts (or ``{"explanations": [...]}``) or JSON lines;
* :func:`from_parquet` -- a Parquet table with those columns (``heedful bench export`` writes
  one: importing it back gives heedful's own explanations);
* :func:`from_captum` -- Captum attributions ``[B, S]`` (or ``[B, S, H]``, summed over ``H`` as
  Captum's token attributions are) with the ``input_ids`` ``[B, S]`` they were computed for;
* :func:`from_inseq` -- Inseq's ``FeatureAttributionOutput`` or the JSON file its ``save()``
  writes (decoder-only models: one explanation per generated token, scoring the tokens before
  it); read without Inseq installed.

Alignment
---------
Each explanation becomes a :class:`~heedful.Explanation` of the model's own tokens of its text:

1. **token ids** (``token_ids``, or Captum's / Inseq's ids) are matched one to one with the
   model's ids; a special token on one side only is skipped (it scores 0 on the model's side);
2. otherwise **tokens equal to the model's** are taken as they are;
3. otherwise each imported token gets a **character span** -- its ``offsets``, or the place of
   the token's text in the text, found left to right (sub-word markers ``##``, ``Ġ``, ``▁``
   dropped; case and accents ignored) -- and each model token's score is the **sum of the
   scores of the imported tokens its characters overlap** (a word's score goes to each of its
   sub-words, so they rank together; finer imported pieces add up).

A model token (not special) that no imported token covers, an imported token found nowhere
(or with an out-of-range span), or ids that differ is a one-line :class:`AlignmentError`
naming the example, the position and the fix. Imported tokens past the model's ``max_length``
are dropped (the explanation is marked ``truncated``).

The target of each explanation is the record's ``target`` (a class index or label, a token;
``target_indices``: explicit output columns), else the model's predicted class / next token.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.engine.targets import Columns, Target
from heedful.errors import InputError
from heedful.explanation import Cost, Explanation, Explanations
from heedful.model import Model

FIELDS: dict[str, str] = {
    "text": "the explained text (required)",
    "scores": "one score per token (required; a list of lists: layers x tokens)",
    "id": "example id (also 'example_id'; default: the record's position)",
    "text_pair": "second segment of a text pair",
    "tokens": "the tokens the scores belong to",
    "raw_tokens": "the tokenizer's symbols of those tokens (heedful's own files): read instead of 'tokens' when given",
    "token_ids": "their vocabulary ids (also 'input_ids'): aligned one to one when given",
    "offsets": "character [start, end] of each token in text (null for special tokens)",
    "segments": "with text_pair and offsets: 0 when a token's offsets are in text, 1 in text_pair",
    "target": "what was explained: a class index or label, or a token (default: the prediction)",
    "target_indices": "explicit output column(s) explained (two: target and foil of a contrast)",
    "layer_scores": "layers x tokens scores; when present they replace 'scores'",
    "label": "gold label (for accuracy when the file is the dataset)",
    "rating": "gold value (regression)",
    "evidence": "evidence words or [start, end] spans (for plausibility when the file is the dataset)",
    "method": "which method computed it (a file of several methods is read one method at a time)",
}
"""The fields an imported record may have (``heedful bench export``'s columns are among them)."""

SPECIAL_LIKE = re.compile(r"^(\[[A-Za-z_]+\]|<[^<>\s]+>|<\|[^|\s]+\|>)$")
"""Tokens that look special (``[CLS]``, ``</s>``, ``<|endoftext|>``) though another tokenizer's."""

_MARKERS = (("Ġ", " "), ("▁", " "), ("Ċ", "\n"), ("ĉ", "\t"))


class AlignmentError(InputError):
    """An imported explanation whose tokens cannot be matched to the model's."""


@dataclass
class Record:
    """One explanation computed elsewhere, before alignment. ``scores`` ``[M]`` (or ``[L, M]``)
    over the record's ``M`` tokens; ``target``: ``None`` (the prediction), a class index or
    label, a token string, or explicit ``Columns``-style indices (``target_indices``)."""

    id: str
    text: str
    scores: np.ndarray
    text_pair: str | None = None
    tokens: list[str] | None = None
    token_ids: list[int] | None = None
    offsets: list[tuple[int, int] | None] | None = None
    segments: list[int | None] | None = None
    target: int | str | None = None
    target_indices: tuple[int, ...] | None = None
    gold: dict[str, Any] = field(default_factory=dict)
    optional: bool = False
    """Left out, not an error, when it cannot be aligned (a generated step whose tokens are not
    how the model's tokenizer encodes their text: no text gives them, so no metric can)."""

    @property
    def width(self) -> int:
        return int(self.scores.shape[-1])


# ---------------------------------------------------------------------------- reading records
def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _list(value: Any, what: str, where: str) -> list | None:
    if _missing(value) or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)  # a CSV export writes lists as JSON
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: {what} is not a list", hint=f"give {what} as a JSON list") from exc
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise InputError(f"{where}: {what} is not a list, got {type(value).__name__}", hint=f"give {what} as a list")
    return [v.tolist() if hasattr(v, "tolist") else v for v in value]


def _scores(value: Any, where: str) -> np.ndarray:
    items = _list(value, "scores", where)
    if not items:
        raise InputError(f"{where} has no scores", hint="every record needs 'scores': one number per token")
    try:
        array = np.asarray([[np.nan if v is None else v for v in row] for row in items] if isinstance(items[0], list) else
                           [np.nan if v is None else v for v in items], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: scores are not numbers", hint="give 'scores' as a list of numbers") from exc
    if array.ndim not in (1, 2):
        raise InputError(f"{where}: scores have {array.ndim} dimensions", hint="give tokens (or layers x tokens)")
    return array


def record(data: Mapping[str, Any], index: int = 0) -> Record:
    """A :class:`Record` from one dict with the fields of :data:`FIELDS`."""
    ident = next((str(data[k]) for k in ("id", "example_id") if not _missing(data.get(k))), str(index))
    where = f"record {ident!r}"
    text = data.get("text")
    if _missing(text) or not isinstance(text, str) or not text:
        raise InputError(f"{where} has no text", hint="every record needs a non-empty 'text'")
    layers = data.get("layer_scores")
    scores = _scores(layers if not _missing(layers) and _list(layers, "layer_scores", where) else data.get("scores"), where)
    raw = data.get("raw_tokens")
    tokens = _list(data.get("tokens") if _missing(raw) else raw, "tokens", where)
    ids = _list(data.get("token_ids", data.get("input_ids")), "token_ids", where)
    offsets = _list(data.get("offsets"), "offsets", where)
    segments = _list(data.get("segments"), "segments", where)
    for name, items in (("tokens", tokens), ("token_ids", ids), ("offsets", offsets), ("segments", segments)):
        if items is not None and len(items) != scores.shape[-1]:
            raise InputError(
                f"{where} has {scores.shape[-1]} scores but {len(items)} {name}",
                hint=f"give one of {name} per score",
            )
    indices = _list(data.get("target_indices"), "target_indices", where)
    target = data.get("target")
    pair = data.get("text_pair")
    return Record(
        id=ident,
        text=text,
        scores=scores,
        text_pair=None if _missing(pair) or pair == "" else str(pair),
        tokens=None if tokens is None else [str(t) for t in tokens],
        token_ids=None if ids is None else [int(i) for i in ids],
        offsets=None if offsets is None else [None if o is None else (int(o[0]), int(o[1])) for o in offsets],
        segments=segments,
        target=None if _missing(target) else (int(target) if isinstance(target, int | np.integer) else str(target)),
        target_indices=None if not indices else tuple(int(i) for i in indices),
        gold={k: data[k] for k in ("label", "rating", "evidence") if not _missing(data.get(k))},
    )


def _same(a: Record, b: Record) -> bool:
    return a.text == b.text and a.text_pair == b.text_pair and a.scores.shape == b.scores.shape and bool(
        np.allclose(a.scores, b.scores, equal_nan=True)
    )


def records(items: Iterable[Mapping[str, Any]], method: str | None = None, source: str = "the records") -> list[Record]:
    """:class:`Record` s from dicts. A table of several methods (``heedful bench export``'s)
    needs ``method``; rows repeated per metric are read once (an id seen again with other scores
    is an error)."""
    rows = list(items)
    methods = list(dict.fromkeys(str(r["method"]) for r in rows if not _missing(r.get("method"))))
    if method is not None:
        if method not in methods:
            raise InputError(f"{source} has no explanations of method {method!r}", hint=f"methods found: {', '.join(methods) or 'none'}")
        rows = [r for r in rows if r.get("method") == method]
    elif len(methods) > 1:
        raise InputError(
            f"{source} holds explanations of {len(methods)} methods ({', '.join(methods)})",
            hint="choose one with --method NAME (in Python: method=NAME)",
        )
    runs = list(dict.fromkeys(str(r["run"]) for r in rows if not _missing(r.get("run"))))
    if len(runs) > 1:
        raise InputError(
            f"{source} holds {len(runs)} runs of {method or methods[0]} (other options or seeds)",
            hint="keep the rows of one run (its 'run' column) before importing",
        )
    found: dict[str, Record] = {}
    for index, data in enumerate(rows):
        item = record(data, index)
        if item.id in found:
            if not _same(found[item.id], item):
                raise InputError(f"{source}: example {item.id!r} occurs twice with different text or scores", hint="ids must be unique")
            continue
        found[item.id] = item
    if not found:
        raise InputError(f"{source} holds no explanations", hint="give at least one record with 'text' and 'scores'")
    return list(found.values())


def read_json(path: str | Path, method: str | None = None) -> list[Record]:
    """Records from a JSON list (or ``{"explanations": [...]}``) or JSON-lines file."""
    path = Path(path).expanduser()
    text = _read_text(path)
    stripped = text.lstrip()
    try:
        if stripped.startswith("[") or (stripped.startswith("{") and _single_json(stripped)):
            data = json.loads(stripped)
            items = data.get("explanations", [data]) if isinstance(data, dict) else data
        else:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not JSON or JSON lines: {exc}", hint="write one JSON object per line, or a JSON list") from exc
    if not all(isinstance(i, dict) for i in items):
        raise InputError(f"{path} holds something other than objects", hint="each explanation is a JSON object with text and scores")
    return records(items, method, str(path))


def _single_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"no such file: {path}", hint="give the path of the explanations file")
    return path.read_text(encoding="utf-8")


def read_csv(path: str | Path, method: str | None = None) -> list[Record]:
    """Records from a CSV table whose list fields are JSON (``heedful bench export --format csv``)."""
    import csv

    path = Path(path).expanduser()
    _read_text(path)  # a missing file is an InputError
    with open(path, newline="", encoding="utf-8") as fh:
        rows = [{k: (None if v == "" else v) for k, v in row.items()} for row in csv.DictReader(fh)]
    return records(rows, method, str(path))


def read_parquet(path: str | Path, method: str | None = None) -> list[Record]:
    """Records from a Parquet table (list columns for tokens, scores, offsets)."""
    from heedful.evaluate.export import require_pyarrow

    _, pq = require_pyarrow()
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"no such file: {path}", hint="give the path of the explanations file")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise InputError(f"{path} is not a Parquet file: {exc}", hint="give a .parquet file (or JSON lines)") from exc
    return records(table.to_pylist(), method, str(path))


def captum_records(
    attributions: Any,
    input_ids: Any,
    tokenizer: Any,
    *,
    texts: Sequence[str] | None = None,
    text_pairs: Sequence[str | None] | None = None,
    attention_mask: Any = None,
    target: int | str | Sequence[int | str] | None = None,
    ids: Sequence[str] | None = None,
) -> list[Record]:
    """Records from Captum attributions ``[B, S]`` or ``[B, S, H]`` (summed over ``H``) and the
    ``input_ids`` ``[B, S]`` they were computed for. Padding is left out by ``attention_mask``
    (or, without one, the tokenizer's pad id at either end). ``texts``: the texts the ids
    encode (default: decoded from the ids). ``target``: Captum's target (one for all, or one per
    example)."""
    scores = torch.as_tensor(attributions).detach().to(torch.float64).cpu()
    tokens = torch.as_tensor(input_ids).detach().cpu()
    if scores.dim() == 3:
        scores = scores.sum(dim=-1)
    if scores.dim() == 1:
        scores, tokens = scores[None], tokens.reshape(1, -1)
    if scores.dim() != 2 or tokens.dim() != 2 or scores.shape != tokens.shape:
        raise InputError(
            f"Captum attributions {tuple(torch.as_tensor(attributions).shape)} do not match input ids {tuple(tokens.shape)}",
            hint="give attributions [batch, seq] or [batch, seq, hidden] for input ids [batch, seq]",
        )
    batch = scores.shape[0]
    mask = None if attention_mask is None else torch.as_tensor(attention_mask).bool().cpu().reshape(batch, -1)
    targets = list(target) if isinstance(target, list | tuple) or hasattr(target, "tolist") and getattr(target, "ndim", 0) else None
    if hasattr(target, "tolist") and targets is None:
        target = target.tolist()
    if targets is not None and len(targets) != batch:
        raise InputError(f"{len(targets)} targets for {batch} attributions", hint="give one target, or one per example")
    for name, given in (("texts", texts), ("text_pairs", text_pairs), ("ids", ids)):
        if given is not None and len(given) != batch:
            raise InputError(f"{len(given)} {name} for {batch} attributions", hint=f"give one of {name} per row of the attributions")
    pad = getattr(tokenizer, "pad_token_id", None)
    found = []
    for b in range(batch):
        row = tokens[b].tolist()
        keep = mask[b].tolist() if mask is not None else _unpadded(row, pad)
        kept_ids = [int(i) for i, k in zip(row, keep, strict=True) if k]
        kept_scores = scores[b][torch.tensor(keep, dtype=torch.bool)].numpy()
        text = texts[b] if texts is not None else tokenizer.decode(kept_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        raw = targets[b] if targets is not None else target
        if hasattr(raw, "item"):
            raw = raw.item()
        found.append(
            Record(
                id=str(ids[b]) if ids is not None else str(b),
                text=text,
                scores=kept_scores,
                text_pair=None if text_pairs is None else text_pairs[b],
                token_ids=kept_ids,
                target_indices=(int(raw),) if isinstance(raw, int) else None,
                target=raw if isinstance(raw, str) else None,
            )
        )
    return found


def _unpadded(row: list[int], pad: int | None) -> list[bool]:
    """Positions that are not padding: the pad id's runs at the right (or left) end are left out."""
    keep = [True] * len(row)
    if pad is None:
        return keep
    end = len(row)
    while end > 1 and row[end - 1] == pad:
        end -= 1
    start = 0
    if end == len(row):
        while start < end - 1 and row[start] == pad:
            start += 1
    return [start <= i < end for i in range(len(row))]


# ---------------------------------------------------------------------------- Inseq
def inseq_records(source: Any, tokenizer: Any, steps: str = "all") -> list[Record]:
    """Records from an Inseq ``FeatureAttributionOutput`` (or the path of the JSON its ``save()``
    wrote, read without Inseq). A decoder-only model's output gives one record per generated
    token (``steps="first"``: the first only): the text before it -- the prompt, then the prompt
    and the tokens generated so far decoded by ``tokenizer`` -- scored by that step's
    attributions over those tokens, with the generated token's id as the target. Ids: ``"i"``
    for sequence ``i``'s first step, ``"i.j"`` for step ``j``.

    Every step is ``optional``: one whose tokens are not how the model encodes their text
    (generation need not produce the tokenizer's own encoding) is left out by the alignment.
    Inseq's positions are taken as it wrote them (``attr_pos_start``: the first generated
    position); attribute prompts of different lengths one at a time and merge the outputs
    (``inseq.merge_attributions``), as Inseq pads a batch without an attention mask for models
    whose pad token is their end token."""
    if steps not in ("all", "first"):
        raise InputError(f"steps must be 'all' or 'first', got {steps!r}")
    found: list[Record] = []
    for i, seq in enumerate(_inseq_sequences(source)):
        if seq["source_attributions"] is not None:
            raise InputError(
                f"Inseq sequence {i} has source attributions: an encoder-decoder model's output",
                hint="heedful evaluates decoder-only language models; attribute with a causal LM",
            )
        scores = seq["target_attributions"]
        if scores is None:
            raise InputError(f"Inseq sequence {i} has no target attributions", hint="save the output of model.attribute(...)")
        while scores.ndim > 2:
            scores = scores.sum(axis=-1)  # granular attributions: summed over the hidden size, as Captum's
        target = seq["target"]
        start = int(seq["attr_pos_start"])
        end = int(seq["attr_pos_end"] or len(target))
        count = min(end - start, scores.shape[1])
        for j in range(count if steps == "all" else min(count, 1)):
            position = start + j
            prefix = target[:position]
            ids = [t for _, t in prefix]
            text = seq["prompt"] if j == 0 and _encodes_to(tokenizer, seq["prompt"], ids) else tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
            found.append(
                Record(
                    id=str(i) if j == 0 else f"{i}.{j}",
                    text=text,
                    scores=np.asarray(scores[:position, j], dtype=np.float64),
                    tokens=[t for t, _ in prefix],
                    token_ids=ids,
                    target_indices=(int(target[position][1]),),
                    optional=True,
                )
            )
    return found


def _encodes_to(tokenizer: Any, text: str | None, ids: list[int]) -> bool:
    """Whether ``text`` is encoded as ``ids`` (special tokens aside)."""
    if not text:
        return False
    specials = set(getattr(tokenizer, "all_special_ids", []))
    own = tokenizer(text, add_special_tokens=False)["input_ids"]
    return own == [i for i in ids if i not in specials]


def _inseq_sequences(source: Any) -> list[dict[str, Any]]:
    """Each sequence of an Inseq output as plain data: ``target`` ``[(token, id)]``, its
    ``target_attributions`` / ``source_attributions`` as arrays, ``attr_pos_start`` /
    ``attr_pos_end``, and ``texts[j]``: the text before generated token ``j``."""
    if isinstance(source, str | Path):
        data = _inseq_json(Path(source).expanduser())
        info = data.get("info") or {}
        items = data["sequence_attributions"]
    else:
        info = getattr(source, "info", None) or {}
        items = [vars(seq) for seq in source.sequence_attributions]
    prompts = info.get("input_texts") or []
    found = []
    for i, seq in enumerate(items):
        target = [(str(t["token"]), int(t["id"])) if isinstance(t, dict) else (str(t.token), int(t.id)) for t in seq["target"]]
        start = int(seq.get("attr_pos_start") or 0)
        found.append({
            "target": target,
            "source_attributions": _array(seq.get("source_attributions")),
            "target_attributions": _array(seq.get("target_attributions")),
            "attr_pos_start": start,
            "attr_pos_end": seq.get("attr_pos_end"),
            "prompt": prompts[i] if i < len(prompts) else None,
        })
    return found


def _array(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _inseq_json(path: Path) -> dict[str, Any]:
    """An Inseq JSON file (``save()``, compact or with ``use_primitives=True``; gzip when it
    ends in ``.gz``) as plain data, without Inseq."""
    import gzip

    if not path.is_file():
        raise InputError(f"no such file: {path}", hint="give the JSON file Inseq's save() wrote")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} is not an Inseq JSON file: {exc}", hint="save the output with out.save(path)") from exc
    plain = _inseq_plain(data)
    if not isinstance(plain, dict) or "sequence_attributions" not in plain:
        raise InputError(f"{path} is not an Inseq attribution output", hint="save it with FeatureAttributionOutput.save(path)")
    return plain


def _inseq_plain(value: Any) -> Any:
    """Inseq's JSON encoding undone: class instances (``__instance_type__`` + ``attributes``)
    become dicts, b64 safetensors and ``__ndarray__`` arrays become numpy arrays."""
    if isinstance(value, list):
        return [_inseq_plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__instance_type__" in value:
        return _inseq_plain(value.get("attributes", {}))
    if "__ndarray__" in value:
        return _ndarray(value)
    plain = {k: _inseq_plain(v) for k, v in value.items()}
    for name in ("source_attributions", "target_attributions"):
        if isinstance(plain.get(name), str):
            plain[name] = _safetensor(plain[name])
    return plain


def _safetensor(encoded: str) -> np.ndarray:
    import base64

    from safetensors.torch import load

    tensors = load(base64.b64decode(encoded))
    tensor = next(iter(tensors.values()))
    return tensor.to(torch.float64).numpy()


def _ndarray(value: dict[str, Any]) -> np.ndarray:
    """Inseq's ``{"__ndarray__": ..., "dtype", "shape"}``: nested lists, or ``b64:`` /
    ``b64.gz:`` followed by the raw (gzipped) bytes."""
    import base64
    import gzip

    data, dtype = value["__ndarray__"], value.get("dtype", "float64")
    shape = tuple(value.get("shape") or ())
    if isinstance(data, str):
        header, _, body = data.partition(":")
        raw = base64.standard_b64decode(body)
        if header == "b64.gz":
            raw = gzip.decompress(raw)
        elif header != "b64":
            raise InputError(f"an Inseq array has an unknown encoding {header!r}", hint="save the output with Inseq's save()")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(np.float64)
    return np.asarray(data, dtype=np.float64).reshape(shape) if shape else np.asarray(data, dtype=np.float64)


# ---------------------------------------------------------------------------- alignment
@dataclass
class _Side:
    """The model's encoding of one example: tokens, ids, offsets, special flags, segments."""

    tokens: list[str]
    ids: list[int]
    offsets: list[tuple[int, int] | None]
    special: list[bool]
    segments: list[int | None]
    truncated: bool


def _fail(item: Record, message: str, hint: str) -> AlignmentError:
    return AlignmentError(f"example {item.id!r}: {message}", hint=hint)


def _by_ids(item: Record, side: _Side, special_ids: set[int]) -> np.ndarray:
    """``[N, M]`` 0/1: imported token ``j`` is model token ``i`` (same id, in order)."""
    ids = item.token_ids or []
    n, m = len(side.ids), len(ids)
    mapping = np.zeros((n, m))
    i = j = 0
    while i < n and j < m:
        if side.ids[i] == ids[j]:
            mapping[i, j] = 1.0
            i, j = i + 1, j + 1
        elif side.special[i]:
            i += 1
        elif ids[j] in special_ids:
            j += 1
        else:
            raise _fail(
                item,
                f"imported token {j} (id {ids[j]}) differs from the model's token {i} ({side.tokens[i]!r}, id {side.ids[i]})",
                "give ids from this model's tokenizer, or drop token_ids to align by text",
            )
    while i < n and side.special[i]:
        i += 1
    if i < n:
        raise _fail(
            item,
            f"the imported ids end at token {m}, before the model's token {i} ({side.tokens[i]!r})",
            "give the ids of the whole text (the same text the explanation was computed for)",
        )
    rest = [k for k in range(j, m) if ids[k] not in special_ids]
    if rest and not side.truncated:
        raise _fail(
            item,
            f"imported token {rest[0]} (id {ids[rest[0]]}) has no counterpart among the model's {n} tokens",
            "give ids from this model's tokenizer for exactly this text",
        )
    return mapping


def _fold(text: str) -> tuple[str, list[int]]:
    """``text`` case-folded with accents dropped, and the index in ``text`` of each character."""
    chars, where = [], []
    for k, ch in enumerate(text):
        for c in unicodedata.normalize("NFKD", ch).casefold():
            if not unicodedata.combining(c):
                chars.append(c)
                where.append(k)
    return "".join(chars), where


def _clean(token: str, tokenizer: Any) -> list[str]:
    """Candidate surface forms of ``token`` (sub-word markers dropped; the tokenizer's own
    reading of a byte-level token)."""
    found = []
    plain = token[2:] if token.startswith("##") else token
    for marker, char in _MARKERS:
        plain = plain.replace(marker, char)
    found.append(plain.strip())
    try:
        decoded = tokenizer.convert_tokens_to_string([token]).strip()
    except Exception:  # a token the tokenizer does not know
        decoded = ""
    if decoded and decoded not in found and not decoded.startswith("##"):
        found.append(decoded)
    return [f for f in found if f]


def _spans_from_tokens(item: Record, tokenizer: Any) -> tuple[list[tuple[int, int, int] | None], list[bool]]:
    """Each imported token's ``(segment, start, end)`` found in the text(s) left to right, and
    whether it is special (no span). Only whitespace may lie between consecutive tokens."""
    specials = set(getattr(tokenizer, "all_special_tokens", []))
    unk = getattr(tokenizer, "unk_token", None)
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    folded = [_fold(t) for t in texts]
    segment, cursor = 0, 0
    spans: list[tuple[int, int, int] | None] = []
    special: list[bool] = []
    pending: int | None = None  # an unknown token waiting for the next token's start
    for j, token in enumerate(item.tokens or []):
        if token == unk or token in specials or SPECIAL_LIKE.match(token):
            if token == unk or token in ("[UNK]", "<unk>"):
                pending = j
                spans.append(None)
                special.append(False)
                continue
            spans.append(None)
            special.append(True)
            continue
        forms = _clean(token, tokenizer)
        if not forms:  # whitespace only
            spans.append(None)
            special.append(True)
            continue
        located = None
        for seg in range(segment, len(texts)):
            text, where = folded[seg]
            start_at = cursor if seg == segment else 0
            lo = next((p for p, k in enumerate(where) if k >= start_at), len(where))
            for form in forms:
                f, _ = _fold(form)
                hit = text.find(f, lo)
                if hit < 0:
                    continue
                gap = texts[seg][start_at : where[hit]] if hit < len(where) else ""
                if gap.strip() and pending is None:
                    continue
                located = (seg, where[hit], where[hit + len(f) - 1] + 1, gap)
                break
            if located is not None:
                break
            if pending is not None:
                break
        if located is None:
            position = f"character {cursor} of text{'_pair' if segment else ''}"
            raise _fail(
                item,
                f"token {j} ({token!r}) is not found at {position}",
                "give character 'offsets' of the tokens, or 'token_ids' from this model's tokenizer",
            )
        seg, start, end, gap = located
        if pending is not None:
            lead = len(gap) - len(gap.lstrip())
            begin = (cursor if seg == segment else 0) + lead
            spans[pending] = (seg, begin, begin + len(gap.strip())) if gap.strip() else None
            pending = None
        spans.append((seg, start, end))
        special.append(False)
        segment, cursor = seg, end
    if pending is not None:
        rest = texts[segment][cursor:]
        lead = len(rest) - len(rest.lstrip())
        word = rest.strip().split()[0] if rest.strip() else ""
        spans[pending] = (segment, cursor + lead, cursor + lead + len(word)) if word else None
    return spans, special


def _spans_from_offsets(item: Record) -> tuple[list[tuple[int, int, int] | None], list[bool]]:
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    if item.text_pair is not None and item.segments is None:
        raise _fail(item, "offsets of a text pair need 'segments'", "give 'segments' (0: text, 1: text_pair) beside the offsets")
    spans: list[tuple[int, int, int] | None] = []
    special: list[bool] = []
    for j, offset in enumerate(item.offsets or []):
        seg = 0 if item.segments is None or item.segments[j] is None else int(item.segments[j])
        if offset is None or offset[0] == offset[1]:
            spans.append(None)
            special.append(True)
            continue
        start, end = offset
        if seg not in (0, 1) or seg >= len(texts) or not 0 <= start < end <= len(texts[seg]):
            raise _fail(
                item,
                f"token {j} has offsets [{start}, {end}] outside its text ({len(texts[min(seg, len(texts) - 1)])} characters)",
                "give offsets into the record's text",
            )
        spans.append((seg, start, end))
        special.append(False)
    return spans, special


def _by_spans(item: Record, side: _Side, tokenizer: Any) -> tuple[np.ndarray, str]:
    """``[N, M]``: model token ``i`` takes imported token ``j``'s score when their characters
    overlap (special tokens: matched in order by their text)."""
    how = "offsets" if item.offsets is not None else "tokens"
    spans, special = _spans_from_offsets(item) if item.offsets is not None else _spans_from_tokens(item, tokenizer)
    n, m = len(side.tokens), item.width
    mapping = np.zeros((n, m))
    texts = [item.text] + ([item.text_pair] if item.text_pair is not None else [])
    reach = [0, 0]  # the end of what the model covers, per segment
    for i in range(n):
        if side.offsets[i] is not None and not side.special[i]:
            seg = side.segments[i] or 0
            reach[seg] = max(reach[seg], side.offsets[i][1])
    for j, span in enumerate(spans):
        if span is None:
            continue
        seg, start, end = span
        hits = [
            i for i in range(n)
            if not side.special[i] and side.offsets[i] is not None and (side.segments[i] or 0) == seg
            and max(start, side.offsets[i][0]) < min(end, side.offsets[i][1])
        ]
        if hits:
            mapping[hits, j] = 1.0
        elif texts[seg][start:end].strip() and not (side.truncated and start >= reach[seg]):
            raise _fail(
                item,
                f"imported token {j} ({texts[seg][start:end]!r}, characters {start}-{end}) overlaps none of the model's tokens",
                "give the text the explanation was computed for",
            )
    if item.tokens is not None:  # special tokens of the same text, in order
        model_specials = [i for i in range(n) if side.special[i]]
        for j in [j for j in range(m) if special[j]]:
            match = next((i for i in model_specials if side.tokens[i] == item.tokens[j]), None)
            if match is not None:
                mapping[match, j] = 1.0
                model_specials = model_specials[model_specials.index(match) + 1 :]
    covered = mapping.sum(axis=1) > 0
    for i in range(n):
        if not side.special[i] and side.offsets[i] is not None and not covered[i]:
            start, end = side.offsets[i]
            if not texts[side.segments[i] or 0][start:end].strip():
                continue
            raise _fail(
                item,
                f"the model's token {i} ({side.tokens[i]!r}, characters {start}-{end}) is covered by no imported token",
                f"give {'offsets' if how == 'offsets' else 'tokens'} that cover the whole text (or the model's token ids)",
            )
    return mapping, how


def mapping(item: Record, side: _Side, tokenizer: Any) -> tuple[np.ndarray, str]:
    """How ``item``'s scores land on the model's tokens: ``[N, M]`` weights and how it was
    aligned (``"token ids"``, ``"tokens"`` equal to the model's, ``"offsets"`` or ``"tokens"``
    found in the text)."""
    if item.token_ids is not None:
        specials = set(getattr(tokenizer, "all_special_ids", []))
        return _by_ids(item, side, specials), "token ids"
    if item.tokens is not None and item.tokens == side.tokens:
        return np.eye(len(side.tokens)), "same tokens"
    if item.tokens is None and item.offsets is None:
        raise _fail(
            item,
            f"{item.width} scores and nothing that says which tokens they belong to",
            "give 'tokens', 'offsets' or 'token_ids' with the scores",
        )
    return _by_spans(item, side, tokenizer)


def _target(model: Model, group: list[Record]) -> Target | Columns:
    first = group[0]
    if first.target_indices is not None:
        labels = tuple(
            " vs ".join(model.adapter.output_name(i) for i in r.target_indices) for r in group  # type: ignore[union-attr]
        )
        weights = (1.0,) if len(first.target_indices) == 1 else (1.0, -1.0)
        return Columns(tuple(r.target_indices for r in group), weights, labels)  # type: ignore[misc]
    return Target.parse(first.target)


def _group_key(item: Record) -> tuple:
    if item.target_indices is not None:
        return ("columns", len(item.target_indices), item.text_pair is not None)
    return ("target", repr(item.target), item.text_pair is not None)


def align(
    model: Model,
    items: Sequence[Record],
    name: str = "imported",
    *,
    max_length: int | None = None,
    batch_size: int = 16,
    options: Mapping[str, Any] | None = None,
) -> Explanations:
    """Heedful :class:`~heedful.Explanation` s of ``items`` on ``model``'s tokens (in order),
    recorded as method ``name`` with ``options``; ``details`` hold the example id and how it was
    aligned. Texts are cut to ``max_length`` tokens like heedful's own explanations. An item
    that cannot be aligned is an :class:`AlignmentError` -- or, when it is ``optional``, left
    out (compare the ids in ``details``)."""
    if batch_size < 1:
        raise InputError(f"batch_size must be positive, got {batch_size}")
    tokenizer = model.tokenizer
    groups: dict[tuple, list[int]] = {}
    for k, item in enumerate(items):
        groups.setdefault(_group_key(item), []).append(k)
    found: dict[int, Explanation] = {}
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            part = [items[k] for k in members[start : start + batch_size]]
            pairs = [r.text_pair for r in part]
            problem = model.prepare(
                [r.text for r in part], _target(model, part),
                text_pair=pairs if any(p is not None for p in pairs) else None, max_length=max_length,
            )
            batch = problem.batch
            layers = {r.scores.shape[0] if r.scores.ndim == 2 else 0 for r in part}
            if len(layers) > 1:
                raise InputError(
                    f"records {part[0].id!r} .. {part[-1].id!r} mix token scores and layer-wise scores",
                    hint="import layer-wise and per-token explanations separately",
                )
            depth = layers.pop()
            scores = torch.zeros((len(part), depth, batch.seq_len) if depth else (len(part), batch.seq_len), dtype=torch.float64)
            how = []
            for b, item in enumerate(part):
                n = len(batch.tokens[b])
                side = _Side(
                    tokens=batch.tokens[b], ids=batch.input_ids[b, :n].tolist(), offsets=batch.offsets[b],
                    special=batch.special_mask[b, :n].bool().tolist(), segments=batch.sequence_ids[b],
                    truncated=bool(batch.truncated[b]) if batch.truncated else False,
                )
                try:
                    weights, aligned = mapping(item, side, tokenizer)
                except AlignmentError:
                    if not item.optional:
                        raise
                    how.append(None)
                    continue
                values = np.nan_to_num(item.scores, nan=0.0) @ weights.T  # [N] or [L, N]
                scores[b, ..., :n] = torch.from_numpy(values)
                how.append(aligned)
            made = model.explanations(problem, scores, name, dict(options or {}), Cost(0.0, 0.0, 0.0))
            for k, expl, item, aligned in zip(members[start : start + batch_size], made, part, how, strict=True):
                if aligned is not None:
                    found[k] = replace(expl, details={**expl.details, "example_id": item.id, "aligned_by": aligned})
    return Explanations([found[k] for k in range(len(items)) if k in found])


# ---------------------------------------------------------------------------- public readers
def from_records(
    model: Model,
    items: Iterable[Mapping[str, Any]],
    *,
    name: str = "imported",
    method: str | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
) -> Explanations:
    """Explanations of ``model`` from dicts with the fields of :data:`FIELDS` (``text``,
    ``scores`` and, to align them, ``tokens`` / ``token_ids`` / ``offsets``).

    >>> from heedful.evaluate import from_records, evaluate                       # doctest: +SKIP
    >>> expl = from_records(model, [{"text": "a dull plot", "tokens": ["a", "dull", "plot"],
    ...                              "scores": [0.1, 0.8, 0.1]}])                  # doctest: +SKIP
    >>> evaluate(model, expl, ["aopc"])["aopc"].summary.value                      # doctest: +SKIP
    """
    return align(model, records(items, method), name, max_length=max_length, batch_size=batch_size)


def from_json(model: Model, path: str | Path, *, name: str | None = None, method: str | None = None, **kw: Any) -> Explanations:
    """Explanations of ``model`` from a JSON or JSON-lines file of records (:func:`from_records`)."""
    return align(model, read_json(path, method), name or Path(path).stem, **kw)


def from_parquet(model: Model, path: str | Path, *, name: str | None = None, method: str | None = None, **kw: Any) -> Explanations:
    """Explanations of ``model`` from a Parquet table of records (:func:`from_records`; a
    ``heedful bench export`` table with ``method=``)."""
    return align(model, read_parquet(path, method), name or Path(path).stem, **kw)


def from_captum(
    model: Model,
    attributions: Any,
    input_ids: Any,
    *,
    texts: Sequence[str] | None = None,
    text_pairs: Sequence[str | None] | None = None,
    attention_mask: Any = None,
    target: int | str | Sequence[int | str] | None = None,
    ids: Sequence[str] | None = None,
    name: str = "captum",
    **kw: Any,
) -> Explanations:
    """Explanations of ``model`` from Captum attributions ``[B, S]`` / ``[B, S, H]`` and their
    ``input_ids`` (see :func:`captum_records`), aligned by id.

    >>> ig = captum.attr.LayerIntegratedGradients(forward, model.hf_model.get_input_embeddings())  # doctest: +SKIP
    >>> attr = ig.attribute(input_ids, target=1)                                   # doctest: +SKIP
    >>> from_captum(model, attr, input_ids, target=1)[0].top(3)                     # doctest: +SKIP
    """
    found = captum_records(
        attributions, input_ids, model.tokenizer, texts=texts, text_pairs=text_pairs,
        attention_mask=attention_mask, target=target, ids=ids,
    )
    return align(model, found, name, **kw)


def from_inseq(model: Model, source: Any, *, name: str = "inseq", steps: str = "all", **kw: Any) -> Explanations:
    """Explanations of ``model`` (a causal LM) from an Inseq ``FeatureAttributionOutput`` or the
    JSON file its ``save()`` wrote (see :func:`inseq_records`); the steps that cannot be aligned
    are left out (compare ``details["example_id"]``), and none aligned is an error.

    >>> out = inseq.load_model(hf_model, "saliency", tokenizer=tok).attribute("The cat")  # doctest: +SKIP
    >>> out.save("cat.json")                                                        # doctest: +SKIP
    >>> from_inseq(model, "cat.json")[0].target.label                               # doctest: +SKIP
    """
    if model.task != "causal_lm":
        raise InputError(f"Inseq explains generation; {model.name} is a {model.task} model", hint="use a causal language model")
    found = inseq_records(source, model.tokenizer, steps)
    explained = align(model, found, name, **kw)
    if found and not explained:
        raise AlignmentError(
            f"none of the {len(found)} Inseq steps matches {model.name}'s tokens",
            hint="import the output with the model (and tokenizer) Inseq attributed",
        )
    return explained

