"""The heads heedful explains, in one table.

Each row ties a ``transformers`` model-class suffix (``BertForSequenceClassification`` ends in
``ForSequenceClassification``) to the tasks that head serves and to the ``Auto`` class that loads
it. :func:`heedful.adapters.infer_task` reads the table to name a loaded model's task;
:func:`heedful.load` reads it to pick the loader of a checkpoint (by task, or by the
architectures its config records).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    """A head: class-name ``suffix``, the ``tasks`` it serves (the first is the one inferred when
    the config does not ask for another) and its ``transformers`` ``auto_class`` name."""

    suffix: str
    tasks: tuple[str, ...]
    auto_class: str


HEADS: tuple[Head, ...] = (
    Head("ForSequenceClassification", ("classification", "regression"), "AutoModelForSequenceClassification"),
    Head("ForMaskedLM", ("masked_lm",), "AutoModelForMaskedLM"),
    Head("ForCausalLM", ("causal_lm",), "AutoModelForCausalLM"),
    Head("LMHeadModel", ("causal_lm",), "AutoModelForCausalLM"),
    Head("ForConditionalGeneration", ("seq2seq_lm",), "AutoModelForSeq2SeqLM"),
    Head("MTModel", ("seq2seq_lm",), "AutoModelForSeq2SeqLM"),
)
TASKS: tuple[str, ...] = tuple(dict.fromkeys(task for head in HEADS for task in head.tasks))
"""Every task heedful explains: classification, regression, masked_lm, causal_lm, seq2seq_lm."""


def head_of_class(class_name: str) -> Head | None:
    """The head a model class (or a config's architecture name) ends with, if heedful knows it."""
    return next((head for head in HEADS if class_name.endswith(head.suffix)), None)


def head_of_task(task: str) -> Head | None:
    """The head that serves ``task`` (``None`` for an unknown task)."""
    return next((head for head in HEADS if task in head.tasks), None)
