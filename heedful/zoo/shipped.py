"""Fine-tuned weights that ship inside the package, stored as what they add to a base model.

Training a zoo classifier takes minutes; assembling it from its base model and a
shipped file takes seconds. A shipped file (``heedful/zoo/deltas/<name>.safetensors``)
holds, in float16:

- ``delta/<key>``: the fine-tuned tensor minus the base model's, for every tensor
  the base checkpoint has and training changed (an unchanged tensor is left out);
- ``full/<key>``: tensors the base checkpoint lacks (a freshly initialised head).

Storing differences rather than the weights keeps float16's relative rounding
(2**-11) on the small change, not on the whole weight. The safetensors header
carries a JSON record of the build that produced the file (``record``). The
file's sha256 is pinned in :mod:`heedful.zoo.builders` and checked before any
tensor is read; a mismatch is an error, never a silent retrain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from heedful.errors import HeedfulError

SHIPPED_DIR = Path(__file__).parent / "deltas"
FORMAT = "heedful-shipped-weights/1"
_DELTA, _FULL = "delta/", "full/"


@dataclass(frozen=True)
class ShippedWeights:
    """A shipped weights file, pinned by its sha256."""

    file: str
    sha256: str

    @property
    def path(self) -> Path:
        return SHIPPED_DIR / self.file


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(weights: ShippedWeights) -> Path:
    """The path of ``weights`` once its sha256 matches the pinned one; a HeedfulError otherwise."""
    path = weights.path
    if not path.is_file():
        raise HeedfulError(
            f"the shipped weights {path} are missing from this installation",
            hint="reinstall heedful, or train the model: heedful models build NAME --from-scratch",
        )
    found = file_sha256(path)
    if found != weights.sha256:
        raise HeedfulError(
            f"the shipped weights {path} have sha256 {found}, not the pinned {weights.sha256}",
            hint="reinstall heedful (the file is damaged or was replaced), or train the model: "
            "heedful models build NAME --from-scratch",
        )
    return path


def differences(
    trained: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor], new_keys: set[str]
) -> dict[str, torch.Tensor]:
    """The tensors to ship: float16 ``trained - base`` for changed tensors of the base, and
    float16 ``trained`` for ``new_keys`` (absent from the base checkpoint). Integer buffers
    must be unchanged (they cannot be stored as float16 differences)."""
    shipped: dict[str, torch.Tensor] = {}
    for key, value in trained.items():
        if key in new_keys:
            value = value.detach()
            shipped[_FULL + key] = (value.to(torch.float16) if value.is_floating_point() else value).contiguous()
            continue
        if key not in base:
            raise ValueError(f"{key} is neither in the base model nor among the new tensors")
        before = base[key]
        if torch.equal(value, before):
            continue
        if not value.is_floating_point():
            raise ValueError(f"integer tensor {key} changed in training; it cannot be shipped as a difference")
        shipped[_DELTA + key] = (value.detach().float() - before.float()).to(torch.float16).contiguous()
    return shipped


def write(path: Path, tensors: dict[str, torch.Tensor], record: dict) -> str:
    """Write a shipped file with ``record`` in its header; return its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": FORMAT, "record": json.dumps(record, sort_keys=True)})
    return file_sha256(path)


def read_record(path: Path) -> dict:
    """The build record stored in a shipped file's header."""
    with safe_open(str(path), framework="pt") as handle:
        header = handle.metadata() or {}
    if header.get("format") != FORMAT:
        raise HeedfulError(f"{path} is not a heedful shipped-weights file ({FORMAT})", hint="reinstall heedful")
    return json.loads(header["record"])


@torch.no_grad()
def apply(model: torch.nn.Module, path: Path, new_keys: set[str]) -> dict[str, int]:
    """Add the shipped differences to ``model`` (which holds the base weights) and set its new
    tensors, in place and in the model's dtype; counts of tensors changed and set.

    Every tensor of the file must name a tensor of ``model`` with the same shape, and every
    one of ``new_keys`` (what the base checkpoint lacked) must be set by the file.
    """
    state = model.state_dict()
    counts = {"added": 0, "set": 0}
    unset = set(new_keys)
    with safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
            kind = _DELTA if name.startswith(_DELTA) else _FULL
            key = name[len(kind):]
            if not name.startswith((_DELTA, _FULL)) or key not in state:
                raise HeedfulError(f"{path} holds {name!r}, which the model has no place for", hint="reinstall heedful")
            value = handle.get_tensor(name)
            target = state[key]
            if value.shape != target.shape:
                raise HeedfulError(
                    f"{path}: {key} has shape {tuple(value.shape)}, the model's {tuple(target.shape)}",
                    hint="reinstall heedful",
                )
            if kind == _DELTA:
                target.add_(value.to(target.dtype))
                counts["added"] += 1
            else:
                target.copy_(value.to(target.dtype))
                counts["set"] += 1
                unset.discard(key)
    if unset:
        raise HeedfulError(f"{path} does not set {', '.join(sorted(unset))}", hint="reinstall heedful")
    return counts


def compare(
    model: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> dict[str, float | str]:
    """How far the floating tensors of ``model`` are from ``reference`` (same keys):
    the largest ``max|a - b| / max|b|`` over tensors, the tensor it occurs in, and the largest
    relative Frobenius distance ``|a - b| / |b|``."""
    worst, worst_key, worst_norm = 0.0, "", 0.0
    for key, ref in reference.items():
        if not ref.is_floating_point():
            continue
        a, b = model[key].float(), ref.float()
        scale = float(b.abs().max())
        if scale == 0.0:
            continue
        rel = float((a - b).abs().max()) / scale
        worst_norm = max(worst_norm, float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)))
        if rel >= worst:
            worst, worst_key = rel, key
    return {"max_relative_difference": worst, "tensor": worst_key, "max_relative_norm_difference": worst_norm}
