"""Interception: read, replace or attach a rule to any role of a model, for a ``with`` block.

    with adapter.intercept() as hooks:
        probs = hooks.record("probs")                          # {layer: [B, H, N, M]}
        hooks.replace("value", lambda v: v * keep[..., None])  # every layer's value vectors
        hooks.replace("context", halve_head_2, layers=[0], per_head=True)  # [B, N, H, d]
        logits = adapter.forward(batch, anchor).logits

Roles are named by the adapter (:mod:`heedful.adapters.roles`); a caller names a role and the
layers, never a module. Three things can be done at a role:

* :meth:`Interception.record` keeps the tensor each layer computes (in the autograd graph, so
  gradients with respect to it can be asked for);
* :meth:`Interception.replace` swaps it for a function of it;
* :meth:`Interception.attach` swaps a module output ``y`` for ``rule(x, y)`` with ``x`` the module's
  input -- an autograd function whose forward returns ``y`` and whose backward is the rule's,
  as relevance propagation does (:mod:`heedful.lrp`); :meth:`Interception.attend` swaps the whole
  attention computation of a layer (``softmax(Q K^T * s + mask) V``) for a rule.

Module roles act through forward hooks. Attention probabilities of the families that call
``ALL_ATTENTION_FUNCTIONS`` pass through :func:`heedful_attention`, registered with
``transformers``' ``AttentionInterface`` as ``"heedful"``: eager attention, computed as the
modeling files' ``eager_attention_forward`` does, which hands each call to the open interception
that hooked it. The model is switched to it only when a hook needs it. On exit every hook is
removed and the previous attention implementation restored, so the model computes exactly what it
computed before -- also when the block raised.

Hooks at one place run in the order they were registered; a recording sees the tensor as left by
the hooks registered before it. One interception can be open per model at a time.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from heedful.adapters.kernel import scaled_dot_product
from heedful.adapters.roles import ModelRoles, Site
from heedful.errors import UnsupportedModelError

HEEDFUL_ATTENTION = "heedful"
"""The name :func:`heedful_attention` is registered under with ``AttentionInterface``."""

Rule = Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor | None]
"""``rule(x, value)`` at a site: ``value`` is the tensor there, ``x`` the module's first input
(output sites; ``None`` at input and attention sites); a returned tensor replaces ``value``."""

_ACTIVE: contextvars.ContextVar[tuple[Interception, ...]] = contextvars.ContextVar("heedful_interception", default=())


@dataclass(frozen=True)
class AttentionCall:
    """One call of the attention implementation, with ``eager_attention_forward``'s arguments:
    ``query`` ``[B, H, N, d]``, ``key`` / ``value`` ``[B, Hkv, M, d]``, additive ``mask``
    (broadcastable to ``[B, H, N, M]``) or ``None``, ``scaling`` of the scores, ``dropout``
    probability; ``module`` the attention module that called it, ``layer`` its block."""

    module: nn.Module
    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    dropout: float = 0.0
    softcap: float | None = None


AttentionRule = Callable[[AttentionCall], tuple[torch.Tensor, torch.Tensor]]
"""``rule(call) -> (context [B, N, H, d], probs [B, H, N, M])``, the forward values of eager
attention (the backward is the rule's)."""


def repeat_kv(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: repeat ``[B, Hkv, M, d]`` keys / values to ``heads`` heads
    (``transformers``' ``repeat_kv``: kv head ``j`` serves query heads ``j * H / Hkv ...``)."""
    groups = heads // key.shape[1]
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def attention_softmax(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over keys in float32, cast back to ``dtype`` (the decoders' eager attention)."""
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


def softcapped(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``tanh(scores / cap) * cap`` (logit soft-capping; ``scores`` unchanged when ``cap`` is ``None``)."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def eager_attention(
    call: AttentionCall, on_probs: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(cap(Q K^T * scaling) + mask) V`` as ``eager_attention_forward`` computes it (e.g.
    ``transformers/models/gemma2/modeling_gemma2.py``) -> ``([B, N, H, d], [B, H, N, M])``;
    ``on_probs`` may replace the probabilities before they weight the values."""
    key, value = repeat_kv(call.key, call.value, call.query.shape[1])
    scores = softcapped(torch.matmul(call.query, key.transpose(-1, -2)) * call.scaling, call.softcap)
    if call.mask is not None:
        scores = scores + call.mask
    probs = attention_softmax(scores, call.query.dtype)
    if on_probs is not None:
        probs = on_probs(probs)
    probs = nn.functional.dropout(probs, p=call.dropout, training=call.module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def kernel_attention(call: AttentionCall, *, causal: bool = False) -> torch.Tensor:
    """``softmax(Q K^T * scaling + mask) V`` by PyTorch's fused ``scaled_dot_product_attention``
    -> ``[B, N, H, d]``: the context :func:`eager_attention` computes (beyond float rounding)
    with no ``[B, H, N, M]`` probability matrix, so memory stays linear in the length.
    ``causal``: the mask is causality alone (a decoder pass with no padding before a real
    position and no window), given to the kernel as its pattern, which skips the blocks above
    the diagonal. Soft-capped scores (Gemma 2) have no fused form: eager attention's context."""
    if call.softcap is not None:
        return eager_attention(call)[0]
    n, m = call.query.shape[2], call.key.shape[2]
    if causal and n != m:
        from torch.nn.attention.bias import causal_lower_right  # on use: it loads torch._dynamo

        pattern, is_causal = causal_lower_right(n, m), False
    else:
        pattern, is_causal = (None, n > 1) if causal else (call.mask, False)
    out = scaled_dot_product(
        call.query,
        call.key,
        call.value,
        attn_mask=pattern,
        is_causal=is_causal,
        dropout_p=call.dropout if call.module.training else 0.0,
        scale=call.scaling,
        enable_gqa=call.key.shape[1] != call.query.shape[1],
    )
    return out.transpose(1, 2).contiguous()


def row_probabilities(call: AttentionCall, rows: torch.Tensor) -> torch.Tensor:
    """The attention probabilities of the query positions ``rows`` ``[B, K]`` (positions of the
    whole sequence, a key/value cache's included) -> ``[B, H, K, M]``: the rows of eager
    attention's ``softmax(cap(Q K^T * scaling) + mask)`` (Vaswani et al. 2017, Eq. 1) computed
    for those queries alone."""
    batch = torch.arange(call.query.shape[0], device=call.query.device)[:, None]
    local = rows.to(call.query.device) - (call.key.shape[2] - call.query.shape[2])  # [B, K] in this call's queries
    query = call.query.transpose(1, 2)[batch, local].transpose(1, 2)  # [B, H, K, d]
    key, _ = repeat_kv(call.key, call.value, call.query.shape[1])
    scores = softcapped(torch.matmul(query, key.transpose(-1, -2)) * call.scaling, call.softcap)
    if call.mask is not None:
        mask = call.mask.expand(call.query.shape[0], -1, -1, -1)  # [B, 1 or H, N, M]
        scores = scores + mask.transpose(1, 2)[batch, local].transpose(1, 2)
    return attention_softmax(scores, call.query.dtype)


def heedful_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"heedful"`` attention implementation: :func:`eager_attention`, handed to the open
    interception that hooked ``module``'s layer. Same contract as ``eager_attention_forward``
    (a sliding window is in ``attention_mask`` already)."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    call = AttentionCall(module, -1, query, key, value, attention_mask, scaling, dropout, softcap)
    for hooks in reversed(_ACTIVE.get()):
        if hooks.hooks_attention_of(module):
            return hooks.attention(call)
    return eager_attention(call)


AttentionInterface.register(HEEDFUL_ATTENTION, heedful_attention)
AttentionMaskInterface.register(HEEDFUL_ATTENTION, eager_mask)


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[..., H * d] -> [..., H, d]`` (head-major, as ``transformers`` splits heads)."""
    return t.unflatten(-1, (heads, -1))


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """``[..., H, d] -> [..., H * d]``."""
    return t.flatten(-2)


@dataclass
class Kept:
    """The latest tensor seen at a site (``None`` until the site runs)."""

    value: torch.Tensor | None = None


def intercepting(model: nn.Module) -> bool:
    """Whether an interception is open on ``model``."""
    return any(other.model is model for other in _ACTIVE.get())


class Interception:
    """Hooks on ``model`` for the duration of a ``with`` block (see the module docstring).

    ``roles``: the model's roles (role names work only with them; :meth:`ModelAdapter.intercept`
    passes them). Without roles, ``attention`` lists each block's attention module, in block
    order, for :meth:`at` attention sites and :meth:`attend_at`.
    """

    def __init__(self, model: nn.Module, roles: ModelRoles | None = None, attention: Sequence[nn.Module] = ()) -> None:
        self.model = model
        self.roles = roles
        modules = [block.attention for block in roles.blocks] if roles is not None else list(attention)
        self._layer_of = {id(m): i for i, m in enumerate(modules)}
        self._rules: dict[int, AttentionRule] = {}
        self._probs: dict[int, list[Rule]] = {}
        self._tokens: dict[int, torch.Size] = {}
        self._tracked: set[int] = set()
        self._handles: list = []
        self._previous: str | None = None
        self._switched = False
        self._token: contextvars.Token | None = None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Interception:
        if self._token is not None:
            raise RuntimeError("this interception is already open")
        if any(other.model is self.model for other in _ACTIVE.get()):
            raise RuntimeError("an interception is already open on this model; register every hook on that one")
        self._token = _ACTIVE.set((*_ACTIVE.get(), self))
        return self

    def __exit__(self, *exc) -> None:
        try:
            for handle in self._handles:
                handle.remove()
            if self._switched:
                self.model.set_attn_implementation(self._previous)
        finally:
            self._handles.clear()
            self._rules.clear()
            self._probs.clear()
            self._tokens.clear()
            self._tracked.clear()
            self._switched = False
            if self._token is not None:
                _ACTIVE.reset(self._token)
                self._token = None

    def _require_open(self) -> None:
        if self._token is None:
            raise RuntimeError("register hooks inside the `with` block of the interception")

    # ------------------------------------------------------------------ roles
    def sites(self, role: str, layers: Iterable[int] | None = None) -> list[tuple[int, Site]]:
        """``(layer, site)`` of ``role`` in each of ``layers`` (default: every block; negative
        indices count from the last block)."""
        if self.roles is None:
            raise RuntimeError("role names need the model's roles: open the interception with adapter.intercept()")
        count = len(self.roles.blocks)
        chosen = range(count) if layers is None else [int(layer) for layer in layers]
        for layer in chosen:
            if not -count <= layer < count:
                raise IndexError(f"layer {layer} does not exist; the model has {count} blocks")
        return [(layer % count, self.roles.blocks[layer % count].site(role)) for layer in chosen]

    def record(self, role: str, layers: Iterable[int] | None = None, *, per_head: bool = False) -> dict[int, torch.Tensor]:
        """A dict that each forward fills with ``role``'s tensor per layer (kept in the graph);
        ``per_head``: split into heads, ``[..., H * d] -> [..., H, d]``."""
        found: dict[int, torch.Tensor] = {}
        for layer, site in self.sites(role, layers):
            self.at(site, partial(_store, found, layer, _heads(site, per_head)))
        return found

    def replace(
        self,
        role: str,
        fn: Callable[[torch.Tensor], torch.Tensor],
        layers: Iterable[int] | None = None,
        *,
        per_head: bool = False,
    ) -> None:
        """``role``'s tensor becomes ``fn(tensor)`` (same shape) in ``layers``; with ``per_head``
        ``fn`` sees and returns ``[..., H, d]``."""
        for _, site in self.sites(role, layers):
            self.at(site, partial(_apply, fn, _heads(site, per_head)))

    def attach(self, role: str, rule: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], layers: Iterable[int] | None = None) -> None:
        """A module-output role ``y`` becomes ``rule(x, y)``, ``x`` the module's input (e.g. an
        autograd function returning ``y`` with a custom backward)."""
        for _, site in self.sites(role, layers):
            if site.side != "output":
                raise ValueError(f"{role!r} is not a module output; replace it, or attend() for the attention computation")
            self.at(site, rule)

    def attend(self, rule: AttentionRule, layers: Iterable[int] | None = None) -> None:
        """The attention computation of ``layers`` becomes ``rule`` (see :data:`AttentionRule`)."""
        for layer, site in self.sites("probs", layers):
            if site.side != "attention":
                raise UnsupportedModelError(
                    f"{type(self.roles.blocks[layer].attention).__name__} computes its attention inline",
                    hint="its probabilities can be recorded and replaced; its attention computation cannot be swapped",
                )
            self.attend_at(self.roles.blocks[layer].attention, rule)

    # ------------------------------------------------------------------ sites
    def at(self, site: Site, rule: Rule) -> None:
        """Run ``rule(x, value)`` wherever ``site`` passes (see :data:`Rule`)."""
        self._require_open()
        if site.side == "attention":
            self._probs.setdefault(self._layer(site.module), []).append(rule)
            self._use_attention_interface()
            return
        if site.layout is not None:
            self._track_tokens(site.layout)
        if site.first_call_within is not None:
            rule = self._first_call_only(site.first_call_within, rule)
        if site.side == "input":
            hook = partial(self._input_hook, site, rule)
            self._handles.append(site.module.register_forward_pre_hook(hook, with_kwargs=True))
        else:
            hook = partial(self._output_hook, site, rule)
            self._handles.append(site.module.register_forward_hook(hook, with_kwargs=True))

    def keep(self, site: Site) -> Kept:
        """The latest tensor passing ``site``."""
        kept = Kept()
        self.at(site, partial(_keep, kept))
        return kept

    def attend_at(self, module: nn.Module, rule: AttentionRule) -> None:
        """The attention computation of ``module`` (a block's attention module) becomes ``rule``."""
        self._require_open()
        layer = self._layer(module)
        if layer in self._rules:
            raise RuntimeError(f"layer {layer} already has an attention rule")
        self._rules[layer] = rule
        self._use_attention_interface()

    # ------------------------------------------------------------------ attention
    def hooks_attention_of(self, module: nn.Module) -> bool:
        layer = self._layer_of.get(id(module))
        return layer is not None and (layer in self._rules or layer in self._probs)

    def attention(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor]:
        """``call`` under this interception's rule and probability hooks for its layer."""
        call = replace(call, layer=self._layer(call.module))
        hooks = self._probs.get(call.layer, [])
        rule = self._rules.get(call.layer)
        if rule is None:
            return eager_attention(call, partial(_run_probs, hooks, call.layer, True))
        context, probs = rule(call)
        _run_probs(hooks, call.layer, False, probs)
        return context, probs

    def _layer(self, module: nn.Module) -> int:
        try:
            return self._layer_of[id(module)]
        except KeyError:
            raise RuntimeError(f"{type(module).__name__} is not a block's attention module") from None

    def _use_attention_interface(self) -> None:
        if self._switched or not hasattr(self.model, "set_attn_implementation"):
            return
        self._previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(HEEDFUL_ATTENTION)
        self._switched = True
        if self.model.config._attn_implementation != HEEDFUL_ATTENTION:  # transformers only warns
            raise UnsupportedModelError(
                f"{type(self.model).__name__} cannot switch its attention implementation",
                hint="its attention probabilities cannot be intercepted",
            )

    # ------------------------------------------------------------------ forward hooks
    def _input_hook(self, site: Site, rule: Rule, module: nn.Module, args: tuple, kwargs: dict):
        value = _first_input(args, kwargs)
        new = rule(None, self._read(site, value))
        if new is None:
            return None
        new = self._write(site, value, new)
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, _first_tensor_kwarg(kwargs): new}

    def _output_hook(self, site: Site, rule: Rule, module: nn.Module, args: tuple, kwargs: dict, output):
        value = output[0] if isinstance(output, tuple) else output
        x = _first_input(args, kwargs)
        if site.layout is not None:
            x = x.view(*self._tokens[id(site.layout)], *x.shape[1:])
        new = rule(x, self._read(site, value))
        if new is None:
            return None
        new = self._write(site, value, new)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    def _read(self, site: Site, value: torch.Tensor) -> torch.Tensor:
        value = site.take(value)
        if site.layout is not None:
            value = value.view(*self._tokens[id(site.layout)], *value.shape[1:])
        return value

    def _write(self, site: Site, value: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        seen = self._read(site, value)
        if new.shape != seen.shape:
            raise ValueError(f"a replacement at {type(site.module).__name__} has shape {tuple(new.shape)}, not {tuple(seen.shape)}")
        if site.layout is not None:
            new = new.flatten(0, 1)
        return site.put(value, new)

    def _track_tokens(self, module: nn.Module) -> None:
        """Keep ``[B, N]`` of ``module``'s first input for sites that see flattened tokens."""
        if id(module) in self._tracked:
            return

        def hook(mod, args, kwargs):
            self._tokens[id(mod)] = _first_input(args, kwargs).shape[:2]

        self._tracked.add(id(module))
        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _first_call_only(self, scope: nn.Module, rule: Rule) -> Rule:
        calls = [0]

        def reset(mod, args):
            calls[0] = 0

        def gated(x, value):
            calls[0] += 1
            return rule(x, value) if calls[0] == 1 else None

        self._handles.append(scope.register_forward_pre_hook(reset))
        return gated


# ---------------------------------------------------------------------- helpers
def _first_tensor_kwarg(kwargs: dict) -> str:
    if "hidden_states" in kwargs:
        return "hidden_states"
    return next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))


def _first_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """A module's first input: its first positional argument, else ``hidden_states`` (the name
    every family's blocks and attention modules use), else its first tensor keyword."""
    return args[0] if args else kwargs[_first_tensor_kwarg(kwargs)]


def _heads(site: Site, per_head: bool) -> int | None:
    if per_head and site.heads is None:
        raise ValueError("this role is not split into heads")
    return site.heads if per_head else None


def _store(found: dict[int, torch.Tensor], layer: int, heads: int | None, x, value: torch.Tensor) -> None:
    found[layer] = value if heads is None else split_heads(value, heads)


def _keep(kept: Kept, x, value: torch.Tensor) -> None:
    kept.value = value


def _apply(fn: Callable[[torch.Tensor], torch.Tensor], heads: int | None, x, value: torch.Tensor) -> torch.Tensor:
    if heads is None:
        return fn(value)
    return merge_heads(fn(split_heads(value, heads)))


def _run_probs(hooks: list[Rule], layer: int, replaceable: bool, probs: torch.Tensor) -> torch.Tensor:
    for hook in hooks:
        new = hook(None, probs)
        if new is None:
            continue
        if not replaceable:
            raise RuntimeError(f"layer {layer}'s attention rule computes the probabilities; they cannot be replaced too")
        if new.shape != probs.shape:
            raise ValueError(f"replaced probabilities have shape {tuple(new.shape)}, not {tuple(probs.shape)}")
        probs = new
    return probs
