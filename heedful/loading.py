"""``heedful.load``: a zoo name, a local Hugging Face directory or a hub id -> :class:`Model`."""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer

from heedful.adapters import GenericAdapter, adapter_for
from heedful.adapters.heads import TASKS, head_of_class, head_of_task
from heedful.engine.memory import parse_memory
from heedful.engine.precision import check_dtype
from heedful.errors import (
    HeedfulError,
    Hint,
    InputError,
    UnsupportedModelError,
    close_matches,
    did_you_mean,
)
from heedful.model import Model
from heedful.quiet import quiet_transformers


def _auto_class(config, task: str | None) -> type:
    if task is not None:
        head = head_of_task(task)
        if head is None:
            raise HeedfulError(f"unknown task {task!r}", hint=f"use one of {', '.join(TASKS)}")
        return getattr(transformers, head.auto_class)
    for arch in getattr(config, "architectures", None) or []:
        head = head_of_class(arch)
        if head is not None:
            return getattr(transformers, head.auto_class)
    names = ", ".join(getattr(config, "architectures", None) or ["none recorded"])
    raise UnsupportedModelError(
        f"the checkpoint has no head heedful can explain (architectures: {names})",
        hint="heedful needs a sequence-classification, regression, masked-LM or causal-LM head; "
        "or pass task=... to load one",
    )


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
"""A model directory has a tokenizer if it holds one of these."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


ON_CPU = Hint("pass device='cpu'", "use --device cpu")


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device`, or an :class:`InputError` if it is not one or is
    not available here (no CUDA, no such GPU, no MPS)."""
    hint = "use cpu, cuda, cuda:N or mps"
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {device!r}", hint=hint) from None
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found.index is not None and found.index >= count or not count:
            raise InputError(f"device {device!r} is not available ({count} CUDA device(s) here)", hint=ON_CPU)
    elif found.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"device {device!r} is not available here", hint=ON_CPU)
    elif found.type != "cpu":
        raise InputError(f"heedful does not run on {device!r}", hint=hint)
    return found


def load(
    name_or_path: str | os.PathLike,
    task: str | None = None,
    *,
    device: str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    progress: bool = True,
    max_memory: str | int | None = None,
    revision: str | None = None,
    allow_pickle: bool = False,
) -> Model:
    """Load a model to explain.

    ``name_or_path``: a zoo name (``heedful models`` lists them; built on first use), a local
    Hugging Face directory, or a hub id, downloaded into the Hugging Face cache as
    ``transformers`` does (:func:`heedful.hub.fetch`: ``revision`` -- or ``"org/name@REV"``,
    which every command's ``--model`` takes -- pins a branch, tag or commit;
    safetensors weights only unless ``allow_pickle``; ``trust_remote_code`` as in
    ``transformers``; ``HF_HUB_OFFLINE=1`` loads from the cache only). ``task`` is inferred from
    the model class (classification, regression, masked_lm, causal_lm) unless given.
    Attention is loaded in eager mode so that attention probabilities exist.
    ``dtype``: what the weights are stored and run in -- ``torch.float32`` (default),
    ``torch.bfloat16`` or ``torch.float16`` (or ``"fp32"``, ``"bf16"``, ``"fp16"``); a
    half-precision model is explained as it runs, with gradient and relevance sums taken in
    float32 (:data:`heedful.engine.precision.HALF`; per-method differences from float32 in
    ``docs/models.md``). Distinct from a method's ``precision`` option, which runs forward-only
    passes of a float32 model on a lowered copy.
    ``max_memory``: what one pass may use on top of what the process holds (``"4GB"``,
    ``"512MiB"`` or bytes; default half of the memory available once the weights are loaded,
    :func:`heedful.engine.memory.default_budget`); the runner cuts its chunks under it, checkpoints a
    backward or runs a decoder's forward in position chunks where one row needs it, and refuses
    what cannot fit before any work (:mod:`heedful.engine.memory`).

    >>> import heedful
    >>> model = heedful.load("minilm-sentiment")   # doctest: +SKIP
    >>> model.task                                  # doctest: +SKIP
    'classification'
    """
    from heedful import hub, zoo

    budget = None if max_memory is None else parse_memory(max_memory)  # a bad size fails before loading
    check_device(device)
    dtype = check_dtype(dtype)
    name = str(name_or_path)
    info: dict = {}
    if "@" in name and not Path(name).expanduser().exists() and hub.is_repo_id(name.split("@", 1)[0]):
        if revision is not None:
            raise InputError(f"{name} names a revision and revision={revision!r} another", hint="give one of them")
        name, revision = name.split("@", 1)
    if revision is not None and (name in zoo.ENTRIES or Path(name).expanduser().is_dir()):
        raise InputError(f"revision={revision!r} is for hub ids; {name} is a local model", hint="drop the revision")
    if name in zoo.ENTRIES:
        path = zoo.ensure_built(name, progress=progress)
        info = zoo.zoo_info(name)
    else:
        path = Path(name).expanduser()
        if not path.is_dir():
            close = "/" not in name and close_matches(name, zoo.zoo_names())
            if path.exists() or name.startswith((".", "/", "~")) or not hub.is_repo_id(name) or close:
                raise HeedfulError(
                    f"{name} is not a model directory or a zoo model",
                    hint=did_you_mean(
                        name, zoo.zoo_names(), "zoo model",
                        listing="give a zoo name (see `heedful models`), a Hugging Face model directory, or a hub id",
                    ),
                )
            path = hub.fetch(name, revision, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, progress=progress)
    source = str(path)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=True)
    except OSError as exc:
        raise HeedfulError(
            f"{name} has no readable config.json ({_first_line(exc)})",
            hint="zoo names: " + ", ".join(zoo.zoo_names()) + "; or a local Hugging Face directory, or a hub id",
        ) from None
    except ValueError as exc:  # no or an unknown model_type
        raise UnsupportedModelError(
            f"cannot read the model in {name}: {_first_line(exc)}",
            hint="transformers does not know this model type: update transformers, or pass trust_remote_code=True for a model with its own code",
        ) from None
    auto = _auto_class(config, task)
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise HeedfulError(f"{name} has no tokenizer", hint="save the tokenizer next to the model: tokenizer.save_pretrained(folder)")
    with quiet_transformers():
        try:
            hf_model = auto.from_pretrained(
                source,
                attn_implementation="eager",
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
            )
        except Exception as exc:  # noqa: BLE001  (missing, truncated or mismatched weights: transformers raises many kinds)
            raise HeedfulError(
                f"cannot load the weights of {name}: {_first_line(exc)}",
                hint="save the model again (model.save_pretrained(folder)) or rebuild it (`heedful models build NAME --force`)",
            ) from None
        hf_model = hf_model.to(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=True)
        except Exception as exc:  # noqa: BLE001  (corrupt tokenizer files)
            raise HeedfulError(
                f"cannot load the tokenizer of {name}: {_first_line(exc)}",
                hint="save the tokenizer again: tokenizer.save_pretrained(folder)",
            ) from None
    if not getattr(tokenizer, "is_fast", False) and not getattr(hf_model.config, "is_encoder_decoder", False):
        # an encoder–decoder's Python tokenizer (Marian's) is read piece by piece (heedful.adapters.pieces)
        raise UnsupportedModelError(
            f"{type(tokenizer).__name__} is a slow tokenizer; heedful needs character offsets",
            hint="save the model with a fast tokenizer (tokenizer.json)",
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    adapter = adapter_for(hf_model, tokenizer, task=task, name=name)
    if budget is not None:
        adapter.max_memory = budget
    return announced(Model(adapter, name=name, info=info))


def announced(model: Model) -> Model:
    """``model``, having said once (a warning) how many methods it gets when its family is
    not mapped and it runs with the generic adapter (:mod:`heedful.adapters.generic`)."""
    if isinstance(model.adapter, GenericAdapter):
        found = model.methods()
        runs = sum(not missing for missing in found.values())
        warnings.warn(
            f"{model.adapter.described}: heedful has no roles for this family; "
            f"{runs} of {len(found)} methods run on it (`heedful methods --model {model.name}` lists them)",
            GenericModelWarning,
            stacklevel=3,
        )
    return model


class GenericModelWarning(UserWarning):
    """A model loaded with the generic adapter: some methods will refuse it."""


def from_pretrained_objects(hf_model, tokenizer, task: str | None = None, name: str = "model", *, generic: bool = False) -> Model:
    """Wrap already-loaded ``transformers`` objects (load them with ``attn_implementation="eager"``
    for attention methods). A model of a family heedful has not mapped -- or any model, with
    ``generic=True`` -- runs with the generic adapter (:mod:`heedful.adapters.generic`): every
    method that needs only what ``transformers`` exposes; the others refuse before any work.

    >>> import heedful, transformers                                  # doctest: +SKIP
    >>> m = heedful.from_pretrained_objects(hf_model, tokenizer)      # doctest: +SKIP
    """
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return announced(Model(adapter_for(hf_model, tokenizer, task=task, name=name, generic=generic), name=name))


def loader(
    name_or_path: str | os.PathLike, *, max_memory: str | int | None = None, revision: str | None = None, dtype: str = "fp32"
) -> functools.partial[Model]:
    """A picklable call that loads ``name_or_path`` in another process (a Ray worker):
    ``functools.partial(load, ...)`` without progress bars, a local folder by its absolute path
    (workers start in another directory).

    >>> import heedful
    >>> heedful.loading.loader("minilm-sentiment")().task   # doctest: +SKIP
    'classification'
    """
    where = Path(name_or_path).expanduser()
    name = str(where.resolve()) if where.exists() else str(name_or_path)
    pinned = {} if revision is None else {"revision": revision}
    if dtype != "fp32":
        pinned["dtype"] = dtype
    return functools.partial(load, name, max_memory=max_memory, progress=False, **pinned)
