"""Fingerprints: hashes of what a stored result was computed from -- a loaded model's weights,
config and tokenizer, and a dataset split's content -- so that caches and the results store are
keyed by the things themselves, never by their names.

A model's fingerprint is computed once per loaded model and kept on its adapter (a model whose
weights are changed in place after that keeps its first fingerprint: load it again).

>>> import heedful
>>> model = heedful.load("minilm-sentiment")                     # doctest: +SKIP
>>> model_fingerprint(model).digest                               # doctest: +SKIP
'3f9c0d6e1a2b4c5d'
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from heedful.engine.options import canonical_json

if TYPE_CHECKING:
    from heedful.adapters import ModelAdapter
    from heedful.datasets import Dataset
    from heedful.model import Model

DIGITS = 16
"""Hex digits kept of each SHA-256 digest (64 bits)."""

_CACHED = "_heedful_fingerprint"

# Fields of a config that do not change what the model computes: where it was loaded from, the
# transformers version that wrote it, and per-call switches that callers set at run time.
_VOLATILE_CONFIG = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "_commit_hash",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "attn_implementation",
        "dtype",
        "torch_dtype",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_cache",
    }
)

# Keys of a fast tokenizer's serialization that hold the state of its last call, not its rules.
_CALL_STATE = ("truncation", "padding")


def _digest(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8") if isinstance(part, str) else part)
    return digest.hexdigest()[:DIGITS]


@dataclass(frozen=True)
class ModelFingerprint:
    """Hashes of a model's ``weights`` (every parameter and buffer of its state dict: bytes,
    dtype and shape, in order), its ``config`` (JSON without :data:`_VOLATILE_CONFIG`) and its
    ``tokenizer`` (serialized vocabulary, rules and special-token settings)."""

    weights: str
    config: str
    tokenizer: str

    @property
    def digest(self) -> str:
        """One hash of the three parts."""
        return _digest(self.weights, self.config, self.tokenizer)

    def to_dict(self) -> dict[str, str]:
        return {"weights": self.weights, "config": self.config, "tokenizer": self.tokenizer}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> ModelFingerprint:
        return cls(data["weights"], data["config"], data["tokenizer"])

    def changes(self, before: ModelFingerprint) -> list[str]:
        """What differs from ``before``, in words (``["model weights changed"]``)."""
        names = {"weights": "model weights", "config": "model config", "tokenizer": "tokenizer"}
        old, new = before.to_dict(), self.to_dict()
        return [f"{names[part]} changed" for part in names if old[part] != new[part]]


def weights_fingerprint(module: torch.nn.Module) -> str:
    """Hash of every tensor of ``module``'s state dict (a tied tensor counts once, by position)."""
    digest = hashlib.sha256()
    seen: dict[tuple, int] = {}
    for index, tensor in enumerate(module.state_dict().values()):
        tensor = tensor.detach()
        identity = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)};".encode())
        if identity in seen and tensor.numel():
            digest.update(f"tied:{seen[identity]};".encode())
            continue
        seen[identity] = index
        flat = tensor.cpu().contiguous().reshape(-1)
        digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()[:DIGITS]


def config_fingerprint(config: Any) -> str:
    """Hash of a ``transformers`` config's JSON without the fields that do not change results."""
    data = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG}
    return _digest(canonical_json(data))


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of a tokenizer's vocabulary and rules (a fast tokenizer's serialization without its
    call state; a slow one's vocabulary) and its special-token and side settings."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        rules = json.loads(backend.to_str())
        for key in _CALL_STATE:
            rules.pop(key, None)
    else:
        rules = {"vocab": tokenizer.get_vocab()}
    settings = {
        "special": tokenizer.special_tokens_map,
        "padding_side": getattr(tokenizer, "padding_side", None),
        "truncation_side": getattr(tokenizer, "truncation_side", None),
        "model_max_length": getattr(tokenizer, "model_max_length", None),
    }
    # plain json.dumps: the rules are JSON already, and canonical_json's walk over a large
    # vocabulary costs several times more
    return _digest(json.dumps({"rules": rules, "settings": settings}, sort_keys=True, separators=(",", ":")))


def model_fingerprint(model: Model | ModelAdapter) -> ModelFingerprint:
    """The fingerprint of a loaded model (a :class:`heedful.Model` or its adapter), computed the
    first time it is asked for and kept on the adapter."""
    adapter = getattr(model, "adapter", model)
    found = getattr(adapter, _CACHED, None)
    if found is None:
        found = ModelFingerprint(
            weights=weights_fingerprint(adapter.hf_model),
            config=config_fingerprint(adapter.hf_model.config),
            tokenizer=tokenizer_fingerprint(adapter.tokenizer),
        )
        setattr(adapter, _CACHED, found)
    return found


def dataset_fingerprint(data: Dataset) -> str:
    """Hash of a dataset split's content: every example (id, text, pair, label, rating, evidence,
    target and foil words, metadata) in order, and the label names gold labels are read with."""
    digest = hashlib.sha256(canonical_json({"label_names": data.label_names, "task": data.task}).encode())
    for example in data:
        digest.update(canonical_json(example.to_dict()).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:DIGITS]
