"""``heedful.load``: a zoo name, a local Hugging Face directory or a hub id -> :class:`Model`."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer

from heedful.adapters import FAMILIES, adapter_for
from heedful.adapters.heads import TASKS, head_of_class, head_of_task
from heedful.errors import HeedfulError, UnsupportedModelError
from heedful.memory import parse_memory
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


def load(
    name_or_path: str | os.PathLike,
    task: str | None = None,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    progress: bool = True,
    max_memory: str | int | None = None,
) -> Model:
    """Load a model to explain.

    ``name_or_path``: a zoo name (``heedful models`` lists them; built on first use), a local
    Hugging Face directory, or a hub id (where a hub is reachable). ``task`` is inferred from
    the model class (classification, regression, masked_lm, causal_lm) unless given.
    Attention is loaded in eager mode so that attention probabilities exist.
    ``max_memory``: what one pass may use on top of what the process holds (``"4GB"``,
    ``"512MiB"`` or bytes; default half of the memory available once the weights are loaded,
    :func:`heedful.memory.default_budget`); the runner cuts its chunks under it, checkpoints a
    backward or runs a decoder's forward in position chunks where one row needs it, and refuses
    what cannot fit before any work (:mod:`heedful.memory`).

    >>> import heedful
    >>> model = heedful.load("minilm-sentiment")   # doctest: +SKIP
    >>> model.task                                  # doctest: +SKIP
    'classification'
    """
    from heedful import zoo

    budget = None if max_memory is None else parse_memory(max_memory)  # a bad size fails before loading
    name = str(name_or_path)
    info: dict = {}
    if name in zoo.ENTRIES:
        path = zoo.ensure_built(name, progress=progress)
        info = zoo.zoo_info(name)
        local = True
    else:
        path = Path(name).expanduser()
        local = path.is_dir()
        if not local and (path.exists() or name.startswith((".", "/", "~"))):
            raise HeedfulError(
                f"{name} is not a model directory",
                hint="give a zoo name (see `heedful models`), a Hugging Face model directory, or a hub id",
            )
    source = str(path) if local else name
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=local)
    except OSError as exc:
        raise HeedfulError(
            f"could not load a model from {name!r}: {exc}",
            hint="zoo names: " + ", ".join(zoo.zoo_names()) + "; or a local Hugging Face directory",
        ) from exc
    if config.model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"architecture {config.model_type!r} is not supported",
            hint="supported families: " + ", ".join(sorted(FAMILIES)),
        )
    auto = _auto_class(config, task)
    with quiet_transformers():
        hf_model = auto.from_pretrained(
            source,
            attn_implementation="eager",
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            local_files_only=local,
        ).to(device)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=local)
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModelError(
            f"{type(tokenizer).__name__} is a slow tokenizer; heedful needs character offsets",
            hint="save the model with a fast tokenizer (tokenizer.json)",
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    adapter = adapter_for(hf_model, tokenizer, task=task, name=name)
    if budget is not None:
        adapter.max_memory = budget
    return Model(adapter, name=name, info=info)


def from_pretrained_objects(hf_model, tokenizer, task: str | None = None, name: str = "model") -> Model:
    """Wrap already-loaded ``transformers`` objects (load them with ``attn_implementation="eager"``
    for attention methods).

    >>> import heedful, transformers                                  # doctest: +SKIP
    >>> m = heedful.from_pretrained_objects(hf_model, tokenizer)      # doctest: +SKIP
    """
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return Model(adapter_for(hf_model, tokenizer, task=task, name=name), name=name)
