"""Adapters: the only code that knows architectures (see :class:`ModelAdapter`)."""

from __future__ import annotations

from torch import nn

from heedful.adapters.base import Forward, LMHeadParts, ModelAdapter, PassCounter
from heedful.adapters.families import FAMILIES
from heedful.errors import UnsupportedModelError

__all__ = ["FAMILIES", "Forward", "LMHeadParts", "ModelAdapter", "PassCounter", "adapter_for", "infer_task"]

_HEAD_SUFFIXES = {
    "ForSequenceClassification": "classification",
    "ForMaskedLM": "masked_lm",
    "ForCausalLM": "causal_lm",
    "LMHeadModel": "causal_lm",
}


def infer_task(hf_model: nn.Module) -> str:
    """Task from the model's head: classification, regression, masked_lm or causal_lm."""
    cls_name = type(hf_model).__name__
    for suffix, task in _HEAD_SUFFIXES.items():
        if cls_name.endswith(suffix):
            if task == "classification":
                cfg = hf_model.config
                if cfg.num_labels == 1 or getattr(cfg, "problem_type", None) == "regression":
                    return "regression"
            return task
    raise UnsupportedModelError(
        f"{cls_name} has no head heedful can explain",
        hint="load a checkpoint with a sequence-classification, masked-LM or causal-LM head "
        "(e.g. *ForSequenceClassification)",
    )


def adapter_for(hf_model: nn.Module, tokenizer, task: str | None = None, name: str = "model") -> ModelAdapter:
    """Wrap a loaded ``transformers`` model in the adapter of its family."""
    model_type = getattr(hf_model.config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise UnsupportedModelError(
            f"architecture {model_type!r} ({type(hf_model).__name__}) is not supported",
            hint="supported families: " + ", ".join(sorted(FAMILIES)),
        )
    inferred = infer_task(hf_model)
    if task is not None and task != inferred:
        compatible = {task, inferred} == {"classification", "regression"}
        if not compatible:
            raise UnsupportedModelError(
                f"task {task!r} needs a different head than {type(hf_model).__name__} has ({inferred})",
                hint=f"use task={inferred!r} or load a checkpoint with a {task} head",
            )
    return family(hf_model=hf_model, tokenizer=tokenizer, task=task or inferred, name=name)
