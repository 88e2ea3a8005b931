"""Mask-LRP head masks: the selected heads, their JSON form, the paper's ablations, the cache.

A :class:`HeadMask` says which attention heads Mask-LRP keeps (``mask[l, h] = 1``) and why:
``syntactic[l, h, k]`` (head is syntactic for relation ``k``) and ``positional[l, h]``. It is
saved as JSON together with the statistics it was selected from (:mod:`heedful.lrp.heads`).

Ablations (Song et al. 2024, Sec. 5.2 and 5.4, Table 3, Figure 4) are plain functions of a mask:
:func:`random_mask` (same number of heads, random positions), :func:`corrupted_mask` (a share of
the unselected heads switched on), :func:`without_positional`, :func:`without_syntactic`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from heedful.errors import InputError
from heedful.files.atomic import atomic_file
from heedful.files.cache import heedful_home

FORMAT = "heedful-head-mask/1"
RELATIONS = ("nsubj", "obj", "amod", "advmod")
"""The paper's core relations (UD names; spaCy's ClearNLP label ``dobj`` is ``obj``)."""


@dataclass
class HeadMask:
    """Heads kept by Mask-LRP. ``mask`` ``[L, H]`` bool; ``syntactic`` ``[L, H, 4]`` bool (per
    relation of :data:`RELATIONS`); ``positional`` ``[L, H]`` bool; ``meta``: how it was made
    (model, data, thresholds); ``statistics``: the head statistics (JSON form) or ``None``."""

    mask: np.ndarray
    syntactic: np.ndarray
    positional: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    statistics: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.mask = np.asarray(self.mask, dtype=bool)
        self.syntactic = np.asarray(self.syntactic, dtype=bool)
        self.positional = np.asarray(self.positional, dtype=bool)
        if self.mask.ndim != 2:
            raise InputError(f"a head mask is [layers, heads]; got shape {self.mask.shape}")

    @classmethod
    def from_array(cls, values: Any, meta: dict[str, Any] | None = None) -> HeadMask:
        """A mask from a ``[L, H]`` array of 0/1 (no syntactic / positional breakdown)."""
        mask = np.asarray(values)
        if mask.ndim != 2:
            raise InputError(f"a head mask is [layers, heads]; got shape {mask.shape}")
        if not np.isin(mask, (0, 1)).all():
            raise InputError("a head mask holds 0/1 (or booleans) only")
        mask = mask.astype(bool)
        return cls(mask, np.zeros((*mask.shape, len(RELATIONS)), bool), np.zeros_like(mask), dict(meta or {}))

    @property
    def shape(self) -> tuple[int, int]:
        return self.mask.shape  # type: ignore[return-value]

    @property
    def rate(self) -> float:
        """Share of heads kept."""
        return float(self.mask.mean())

    def as_float(self) -> np.ndarray:
        return self.mask.astype(np.float32)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            **self.meta,
            "layers": int(self.mask.shape[0]),
            "heads": int(self.mask.shape[1]),
            "rate": self.rate,
            "kept": int(self.mask.sum()),
            "relations": list(RELATIONS),
            "mask": self.mask.astype(int).tolist(),
            "syntactic": self.syntactic.any(axis=-1).astype(int).tolist(),
            "syntactic_by_relation": self.syntactic.astype(int).tolist(),
            "positional": self.positional.astype(int).tolist(),
            "statistics": self.statistics,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadMask:
        if data.get("format") != FORMAT or "mask" not in data:
            raise InputError("not a heedful head-mask file", hint="make one with `heedful heads --model M --out FILE`")
        keys = ("format", "layers", "heads", "rate", "kept", "relations", "mask", "syntactic", "syntactic_by_relation", "positional", "statistics")
        meta = {k: v for k, v in data.items() if k not in keys}
        mask = np.asarray(data["mask"], dtype=bool)
        synt = np.asarray(data.get("syntactic_by_relation") or np.zeros((*mask.shape, len(RELATIONS))), dtype=bool)
        pos = np.asarray(data.get("positional") or np.zeros(mask.shape), dtype=bool)
        return cls(mask, synt, pos, meta, data.get("statistics"))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        with atomic_file(path) as part:
            part.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadMask:
        path = Path(path).expanduser()
        if not path.is_file():
            raise InputError(f"no head-mask file at {path}", hint="make one with `heedful heads --model M --out FILE`")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path} is not JSON ({exc})") from exc
        return cls.from_dict(data)


# ---------------------------------------------------------------------- ablations
def random_mask(mask: HeadMask, seed: int = 0) -> HeadMask:
    """As many heads as ``mask`` keeps, drawn uniformly at random (seeded): the paper's
    "Random" baseline (Table 1, mean and std over seeds)."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(mask.mask.size, dtype=bool)
    flat[rng.choice(mask.mask.size, size=int(mask.mask.sum()), replace=False)] = True
    return HeadMask.from_array(flat.reshape(mask.shape), {**mask.meta, "ablation": f"random(seed={seed})"})


def corrupted_mask(mask: HeadMask, rate: float, seed: int = 0) -> HeadMask:
    """``mask`` with ``round(rate * unselected)`` of its unselected heads switched on, chosen at
    random (seeded): the paper's corruption ablation (Figure 4). ``rate = 1`` keeps every head."""
    if not 0.0 <= rate <= 1.0:
        raise InputError(f"corruption rate must be in [0, 1], got {rate}")
    rng = np.random.default_rng(seed)
    off = np.flatnonzero(~mask.mask.ravel())
    flat = mask.mask.ravel().copy()
    flat[rng.choice(off, size=int(round(rate * off.size)), replace=False)] = True
    out = replace(mask, mask=flat.reshape(mask.shape), meta={**mask.meta, "ablation": f"corrupted(rate={rate}, seed={seed})"})
    out.statistics = None
    return out


def without_positional(mask: HeadMask) -> HeadMask:
    """Syntactic heads only ("Ours w/o M_pos", Table 3)."""
    synt = mask.syntactic.any(axis=-1)
    return HeadMask(synt, mask.syntactic, np.zeros_like(mask.positional), {**mask.meta, "ablation": "without positional"})


def without_syntactic(mask: HeadMask) -> HeadMask:
    """Positional heads only ("Ours w/o M_synt", Table 3)."""
    return HeadMask(
        mask.positional.copy(), np.zeros_like(mask.syntactic), mask.positional, {**mask.meta, "ablation": "without syntactic"}
    )


Ablation = Literal["random", "corrupted", "no_positional", "no_syntactic"]
ABLATIONS: tuple[str, ...] = Ablation.__args__


def ablate(mask: HeadMask, kind: str, seed: int = 0, rate: float = 0.1) -> HeadMask:
    """One of the paper's ablations by name: ``random`` (:func:`random_mask`), ``corrupted``
    (:func:`corrupted_mask` at ``rate``), ``no_positional``, ``no_syntactic``."""
    if kind == "random":
        return random_mask(mask, seed)
    if kind == "corrupted":
        return corrupted_mask(mask, rate, seed)
    if kind == "no_positional":
        return without_positional(mask)
    if kind == "no_syntactic":
        if not mask.positional.any() and not mask.syntactic.any() and mask.mask.any():
            raise InputError("this mask has no syntactic / positional breakdown", hint="use a mask saved by `heedful heads`")
        return without_syntactic(mask)
    raise InputError(f"unknown ablation {kind!r}", hint="use one of: " + ", ".join(ABLATIONS))


# ---------------------------------------------------------------------- cache / options
def cache_path(adapter: Any, *, dataset: str = "movies", split: str = "train", limit: int | None = None) -> Path:
    """Where the default mask of a loaded model (its adapter, or a :class:`heedful.Model`) computed
    from the first ``limit`` texts of ``dataset``'s ``split`` is cached:
    ``heedful_home()/head_masks/<name>-<key>.json``, the key hashing the model's fingerprint
    (weights, config, tokenizer) and those settings -- so two models wrapped under one name, or a
    rebuilt model, never share a mask. The file keeps the head statistics, from which masks of
    other thresholds are selected."""
    from heedful.engine.options import canonical_json
    from heedful.fingerprint import DIGITS, model_fingerprint

    adapter = getattr(adapter, "adapter", adapter)
    if isinstance(adapter, str | Path):
        raise TypeError("cache_path takes the loaded model, not its name: the cache is keyed by its fingerprint")
    settings = {"model": model_fingerprint(adapter).digest, "dataset": dataset, "split": split, "limit": limit}
    digest = hashlib.sha256(canonical_json(settings).encode()).hexdigest()[:DIGITS]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "__", str(adapter.name).strip("/")) or "model"
    return heedful_home() / "head_masks" / f"{safe[-80:]}-{digest}.json"


def as_head_mask(value: Any) -> HeadMask:
    """A :class:`HeadMask` from a mask, a path to a saved mask, or a ``[L, H]`` 0/1 array."""
    if isinstance(value, HeadMask):
        return value
    if isinstance(value, str | Path):
        return HeadMask.load(value)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    return HeadMask.from_array(value)
