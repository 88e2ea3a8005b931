"""Lower precision: the :class:`~heedful.adapters.ModelAdapter`'s copies whose model runs at bf16 or
int8 (:mod:`heedful.engine.precision`), and a forward pass run on one."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from heedful.adapters.passes import Forward
from heedful.engine.batch import Batch
from heedful.engine.precision import lowered_model
from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.adapters.base import ModelAdapter


class Lowering:
    """The lowered copies of :class:`~heedful.adapters.ModelAdapter` (mixed into it): reads its
    ``precision`` and keeps the copies in its ``lowered``."""

    precision: str
    lowered: dict

    def at_precision(self, precision: str) -> ModelAdapter:
        """This adapter with its model at ``precision`` (:func:`heedful.engine.precision.lowered_model`):
        itself at its own precision, else a copy sharing its tokenizer and pass counter, built
        on first use and kept (``lowered``) so that later calls reuse it."""
        if precision == self.precision:
            return self
        if self.precision != "fp32":
            raise InputError(f"a {self.precision} copy of a model is not lowered again", hint="lower the float32 adapter")
        found = self.lowered.get(precision)
        if found is None:
            found = replace(self, hf_model=lowered_model(self.hf_model, precision), precision=precision, lowered={})
            self.lowered[precision] = found
        return found

    def _forward_lowered(self, precision: str, batch: Batch, anchor: torch.Tensor, *, inputs_embeds=None, **options) -> Forward:
        """:meth:`~heedful.adapters.ModelAdapter.forward` run on the copy at ``precision``
        (``inputs_embeds`` cast to its dtype), its logits, hidden states and attention
        probabilities given back in this model's dtype."""
        lowered = self.at_precision(precision)
        if inputs_embeds is not None:
            inputs_embeds = inputs_embeds.to(lowered.word_embeddings.weight.dtype)
        found = lowered.forward(batch, anchor, inputs_embeds=inputs_embeds, **options)
        dtype = self.word_embeddings.weight.dtype
        return Forward(
            found.logits.to(dtype),
            None if found.hidden_states is None else tuple(h.to(dtype) for h in found.hidden_states),
            None if found.attentions is None else tuple(a.to(dtype) for a in found.attentions),
        )
