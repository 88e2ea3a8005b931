"""``LRPSession``: attach a rule set to a model for the duration of a ``with`` block.

Inside the block the model computes exactly what it computes outside it (same forward values);
what changes is what flows backward. The session

* registers the rule set's forward hooks on the modules the adapter names in its
  :class:`~heedful.adapters.lrp_roles.LRPRoles` (removed on exit);
* switches the model's attention implementation to ``"heedful_lrp"`` (registered with
  ``transformers``' ``AttentionInterface`` and ``AttentionMaskInterface``; it computes eager
  attention with the rule set's operations) and restores the previous one on exit;
* records, per layer, the attention probabilities (kept in the graph, so gradients with respect
  to them can be asked for) and the relevance maps the rule set stores during a relevance pass;
* records every block's input ``[B, N, D]`` (for relevance-form rules the first one is made a
  leaf: relevance is read there, and nothing before it is back-propagated).

``mode`` selects what relevance-form rules send backward: ``"gradient"`` (the true gradient) or
``"relevance"``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from heedful.adapters import ModelAdapter
from heedful.lrp.functions import GRADIENT
from heedful.lrp.rules import RuleSet, repeat_kv

LRP_ATTENTION = "heedful_lrp"
_ACTIVE: contextvars.ContextVar[LRPSession | None] = contextvars.ContextVar("heedful_lrp_session", default=None)


def _first_input(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(v for v in kwargs.values() if isinstance(v, torch.Tensor))


class LRPSession:
    """Attach ``rules`` to ``adapter``'s model (see the module docstring).

    Read during the backward passes (set them after the forward): ``mode``; ``head_mask``
    ``[L, H]`` (0/1), which multiplies the relevance of each head's output in the relevance pass
    (Mask-LRP); ``reference_scale`` (keep the Mask-LRP reference's unhalved map for masked
    layers); ``keep_maps`` (record the relevance of attention probabilities in ``maps``).
    """

    def __init__(self, adapter: ModelAdapter, rules: RuleSet) -> None:
        self.adapter = adapter
        self.rules = rules
        self.mode = GRADIENT
        self.head_mask: torch.Tensor | None = None
        self.reference_scale = True
        self.keep_maps = False
        self.probs: dict[int, torch.Tensor] = {}
        self.maps: dict[int, torch.Tensor] = {}
        self.block_inputs: dict[int, torch.Tensor] = {}
        self.last_output: torch.Tensor | None = None
        self.rotary: list[bool] = []
        self._stash: dict[Any, torch.Tensor] = {}
        self._handles: list = []
        self._layer_of: dict[int, int] = {}
        self._previous: str | None = None
        self._token = None

    # ------------------------------------------------------------------ hooks (for rule sets)
    def on_output(self, module: nn.Module, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """Replace ``module``'s output ``y`` by ``fn(x, y)`` (``x`` its first input)."""

        def hook(mod, args, kwargs, output):
            return fn(_first_input(args, kwargs), output)

        self._handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def on_input(self, module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace ``module``'s first positional input ``x`` by ``fn(x)``."""

        def hook(mod, args, kwargs):
            if not args:
                raise RuntimeError(f"{type(mod).__name__} was called without a positional input")
            return (fn(args[0]), *args[1:]), kwargs

        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def capture_input(self, module: nn.Module, key: Any) -> None:
        """Keep ``module``'s first input under ``key`` (see :meth:`stashed`)."""

        def hook(mod, args, kwargs):
            self._stash[key] = _first_input(args, kwargs)

        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def capture_output(self, module: nn.Module, key: Any) -> None:
        """Keep ``module``'s output (as modified by earlier hooks) under ``key``."""

        def hook(mod, args, output):
            self._stash[key] = output

        self._handles.append(module.register_forward_hook(hook))

    def stashed(self, key: Any) -> torch.Tensor:
        return self._stash[key]

    # ------------------------------------------------------------------ records
    def record_probs(self, layer: int, probs: torch.Tensor) -> None:
        self.probs[layer] = probs

    def record_map(self, layer: int, relevance: torch.Tensor) -> None:
        self.maps[layer] = relevance.detach()

    def head_mask_for(self, layer: int) -> torch.Tensor | None:
        return None if self.head_mask is None else self.head_mask[layer]

    def layer_of(self, module: nn.Module) -> int:
        try:
            return self._layer_of[id(module)]
        except KeyError:
            raise RuntimeError(
                f"{type(module).__name__} ran attention but is not a block's attention role"
            ) from None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> LRPSession:
        if _ACTIVE.get() is not None:
            raise RuntimeError("an LRP session is already active")
        roles = self.adapter.lrp_roles()
        self._layer_of = {id(b.attention): i for i, b in enumerate(roles.blocks)}
        self.rotary = [bool(b.rotary) for b in roles.blocks]
        try:
            self.rules.attach(self, roles)
            for index, block in enumerate(self.adapter.blocks):
                self._watch_block(index, block)
            model = self.adapter.hf_model
            if hasattr(model, "set_attn_implementation"):
                self._previous = model.config._attn_implementation
                model.set_attn_implementation(LRP_ATTENTION)
        except BaseException:
            self._remove_hooks()
            raise
        self._token = _ACTIVE.set(self)
        return self

    def _watch_block(self, index: int, block: nn.Module) -> None:
        leaf = index == 0 and self.rules.relevance_form

        def hook(mod, args, kwargs):
            hidden = _first_input(args, kwargs)
            if leaf:
                hidden = hidden.detach().requires_grad_(True)
            self.block_inputs[index] = hidden
            if not leaf:
                return None
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        self._handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
        if index == len(self.adapter.blocks) - 1:

            def keep_output(mod, args, output):
                self.last_output = output[0] if isinstance(output, tuple) else output

            self._handles.append(block.register_forward_hook(keep_output))

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __exit__(self, *exc) -> None:
        self._remove_hooks()
        if self._previous is not None:
            self.adapter.hf_model.set_attn_implementation(self._previous)
        if self._token is not None:
            _ACTIVE.reset(self._token)
        self._stash.clear()


def lrp_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with the active session's rules (plain eager attention without one).

    Same contract as ``eager_attention_forward``: ``query`` ``[B, H, N, d]``, ``key``/``value``
    ``[B, Hkv, M, d]``, additive ``attention_mask`` -> ``([B, N, H, d], [B, H, N, M])``.
    """
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    session = _ACTIVE.get()
    if session is None:
        key, value = repeat_kv(key, value, query.shape[1])
        scores = (query @ key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return (probs @ value).transpose(1, 2).contiguous(), probs
    layer = session.layer_of(module)
    return session.rules.attention(session, layer, query, key, value, attention_mask, scaling)


AttentionInterface.register(LRP_ATTENTION, lrp_attention)
AttentionMaskInterface.register(LRP_ATTENTION, eager_mask)
