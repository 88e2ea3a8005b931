"""Explanations computed elsewhere, read into :class:`Record` s before alignment: dicts with the
fields of :data:`FIELDS`, JSON / JSON lines, CSV and Parquet files (``heedful bench export``
writes one), Captum attributions with their ids, and Inseq's outputs or saved JSON (read
without Inseq installed). :mod:`heedful.evaluate.alignment` matches them to a model's tokens;
:mod:`heedful.evaluate.imports` puts the two together."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.errors import InputError

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
