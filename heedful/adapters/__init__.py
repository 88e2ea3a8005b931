"""Adapters: the only code that knows architectures (see :class:`ModelAdapter`).

Roles (:mod:`heedful.adapters.roles`) say where each tensor of a block lives; the interception
context (:mod:`heedful.adapters.intercept`, ``adapter.intercept()``) reads, replaces or attaches
rules to them; :data:`~heedful.adapters.heads.HEADS` is the table of heads heedful explains.
"""

from __future__ import annotations

from torch import nn

from heedful.adapters.base import ModelAdapter
from heedful.adapters.families import FAMILIES
from heedful.adapters.family_hooks import FamilyHooks, LMHeadParts
from heedful.adapters.generic import GenericAdapter
from heedful.adapters.heads import head_of_class, head_of_task
from heedful.adapters.intercept import Interception
from heedful.adapters.passes import Forward, PassCounter, PrefixStates
from heedful.adapters.recent import RECENT_FAMILIES
from heedful.adapters.roles import ROLES, BlockRoles, ModelRoles, Site
from heedful.adapters.seq2seq import SEQ2SEQ_TASK, Seq2SeqAdapter
from heedful.errors import InputError, UnsupportedModelError

__all__ = [
    "FAMILIES",
    "ROLES",
    "BlockRoles",
    "FamilyHooks",
    "Forward",
    "GenericAdapter",
    "Interception",
    "LMHeadParts",
    "ModelAdapter",
    "ModelRoles",
    "PassCounter",
    "PrefixStates",
    "Seq2SeqAdapter",
    "Site",
    "adapter_for",
    "infer_task",
    "register_family",
]


FAMILIES.update(RECENT_FAMILIES)  # one table: heedful.adapters.families and heedful.adapters.recent


def register_family(model_type: str, adapter_class: type[ModelAdapter], *, overwrite: bool = False) -> None:
    """Make models whose ``config.model_type`` is ``model_type`` load with ``adapter_class`` (a
    :class:`ModelAdapter` subclass filling in the family's roles). A family already registered
    is refused unless ``overwrite`` (as Inseq's ``register_model_config`` guards its table)."""
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, ModelAdapter)):
        raise TypeError(f"{adapter_class!r} is not a ModelAdapter subclass")
    if model_type in FAMILIES and not overwrite:
        raise InputError(
            f"the family {model_type!r} is registered already (to {FAMILIES[model_type].__name__})",
            hint="pass overwrite=True to replace it",
        )
    FAMILIES[model_type] = adapter_class


def infer_task(hf_model: nn.Module) -> str:
    """Task from the model's head: classification, regression, masked_lm or causal_lm."""
    cls_name = type(hf_model).__name__
    head = head_of_class(cls_name)
    if head is None:
        raise UnsupportedModelError(
            f"{cls_name} has no head heedful can explain",
            hint="load a checkpoint with a sequence-classification, masked-LM or causal-LM head "
            "(e.g. *ForSequenceClassification)",
        )
    cfg = hf_model.config
    if "regression" in head.tasks and (cfg.num_labels == 1 or getattr(cfg, "problem_type", None) == "regression"):
        return "regression"
    return head.tasks[0]


def adapter_for(
    hf_model: nn.Module, tokenizer, task: str | None = None, name: str = "model", *, generic: bool = False
) -> ModelAdapter:
    """Wrap a loaded ``transformers`` model in the adapter of its family, or in the
    :class:`GenericAdapter` when its family is not mapped (or ``generic`` asks for it): then
    only the methods that need no more than ``transformers`` exposes for every model run
    (:mod:`heedful.adapters.needs`)."""
    model_type = getattr(hf_model.config, "model_type", None)
    inferred = infer_task(hf_model)
    if inferred == SEQ2SEQ_TASK:
        family = Seq2SeqAdapter  # an encoder–decoder's two sides are laid out on one row whatever its family
    else:
        family = GenericAdapter if generic else FAMILIES.get(model_type, GenericAdapter)
    if task is not None and task != inferred:
        if head_of_task(task) is not head_of_task(inferred):  # classification and regression share a head
            raise UnsupportedModelError(
                f"task {task!r} needs a different head than {type(hf_model).__name__} has ({inferred})",
                hint=f"use task={inferred!r} or load a checkpoint with a {task} head",
            )
    return family(hf_model=hf_model, tokenizer=tokenizer, task=task or inferred, name=name)
