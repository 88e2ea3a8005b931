"""Execution and caches: the :class:`~heedful.adapters.ModelAdapter`'s forward passes -- from ids or
embeddings, read at the anchors; in position chunks with the key/value cache (chunked
prefill); continuing a kept key/value prefix; with PyTorch's fused attention where no
probabilities are returned; the anchored last block -- the head applied to any
representation, and the backward pass counted."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from heedful.adapters.anchored import anchored_last_block, hooked
from heedful.adapters.causal import CAUSAL_ATTENTION
from heedful.adapters.intercept import intercepting
from heedful.adapters.kernel import FUSED_ATTENTION
from heedful.engine.batch import Batch
from heedful.engine.memory import release_heap
from heedful.engine.precision import active_precision
from heedful.errors import InputError
from heedful.interrupt import interruptible


@dataclass
class Forward:
    """One forward pass. ``logits`` ``[B, C]``: head output at each example's anchor position;
    ``hidden_states``: ``L + 1`` tensors ``[B, N, D]`` (0 = embedding module output, L = the
    representation the head reads, after any final norm); ``attentions``: ``L`` tensors
    ``[B, H, N, N]`` (row = query); ``inputs_embeds``: when set, the word embeddings
    ``[B, N, E]`` the pass started from, with the autograd graph from them to ``logits`` kept
    (a gradient method back-propagates through it instead of running the model again);
    ``cache``: the decoder's key/value cache of the whole pass (asked for with ``keep_cache``),
    from which copies that share a prefix with the examples continue
    (:mod:`heedful.engine.reuse`); ``anchor_attention`` ``[B, L, H, N]``: every head's attention
    probabilities from the anchors' rows, averaged over them, when a method's reference pass
    kept them (AT2, :func:`heedful.attribution.at2.at2_reference`)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    inputs_embeds: torch.Tensor | None = None
    cache: PrefixStates | None = None
    anchor_attention: torch.Tensor | None = None
    head_input: torch.Tensor | None = None
    """The representations the head read at the anchors, ``[B, D]`` (``[B, K, D]`` for a span),
    in the autograd graph: the logits depend on the blocks through them alone, so a backward
    can start from their gradient (:class:`heedful.generation_shared.SharedSteps`). ``None``
    where the model's own head ran (the generic and encoder–decoder adapters)."""


class ModelRun(NamedTuple):
    """What :meth:`ModelAdapter._run_model` gives back (see there)."""

    logits: torch.Tensor
    hidden: Sequence[torch.Tensor] | None
    probs: Sequence[torch.Tensor] | None
    cache: object
    head_input: torch.Tensor | None = None


@dataclass
class PrefixStates:
    """The attention keys and values every layer computed for a batch (a decoder's key/value
    cache): ``keys[l]`` / ``values[l]`` ``[B, H_kv, N, d]``. A causal model's states at
    positions before ``p`` do not depend on later tokens, so any copy of example ``b`` that
    agrees with it on its first ``p`` tokens can start from ``keys[l][b, :, :p]`` and run only
    the rest (:meth:`ModelAdapter.forward` with ``prefix=``)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class PassCounter:
    """Counts sequences sent through the model forward and backward (cost bookkeeping)."""

    forward: int = 0
    backward: int = 0

    def reset(self) -> None:
        self.forward = 0
        self.backward = 0


@contextlib.contextmanager
def attention_set(config, implementation: str | None) -> Iterator[None]:
    """``config``'s attention implementation set to ``implementation`` while inside."""
    before = getattr(config, "_attn_implementation", None)
    if implementation is None or implementation == before:
        yield
        return
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


@functools.cache
def _cache_keyword(backbone: type[nn.Module]) -> str:
    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


def _prefix_states(cache) -> PrefixStates:
    """A ``transformers`` key/value cache's keys and values, layer by layer."""
    return PrefixStates(tuple(layer.keys for layer in cache.layers), tuple(layer.values for layer in cache.layers))


def right_padded(mask: torch.Tensor) -> bool:
    """Whether every row of an attention mask ``[B, N]`` is its real positions followed by
    padding only (no hole inside a row), so that a causal model's real positions never attend
    to a padded one."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


class Passes:
    """The passes of :class:`~heedful.adapters.ModelAdapter` (mixed into it): reads the family's
    backbone, blocks and head, counts rows in its ``counter``, runs lowered copies
    (:class:`~heedful.adapters.lowering.Lowering`) and bounded blocks
    (:class:`~heedful.adapters.fitting.MemoryFitting`)."""

    counter: PassCounter
    precision: str

    @property
    def cache_keyword(self) -> str:
        """The name under which the backbone takes and returns a key/value cache: ``cache`` from
        transformers 5.24, ``past_key_values`` before (the old name still works there, with a
        deprecation warning on every first use)."""
        return _cache_keyword(type(self.backbone))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Word embeddings of ids, ``[B, N] -> [B, N, E]`` (the input the gradient methods perturb)."""
        return self.word_embeddings(input_ids)

    def forward(
        self,
        batch: Batch,
        anchor: torch.Tensor,
        *,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        hidden_states: bool = False,
        attentions: bool = False,
        prefix: tuple[PrefixStates, torch.Tensor, int] | None = None,
        checkpoint: bool = False,
        release: bool = False,
        prefill: int | None = None,
        keep_cache: bool = False,
        head: bool = True,
    ) -> Forward:
        """Run the model and the head at each example's ``anchor`` position ``[B]`` (logits
        ``[B, C]``), or at ``K`` positions per example ``[B, K]`` (a span; logits ``[B, K, C]``).
        Without ``head`` the head is not run (logits ``[B, 0]`` / ``[B, K, 0]``) where the pass
        gives its input at the anchors (:attr:`Forward.head_input`), for a caller that reads only
        a few of its columns (:meth:`head_logits` with ``columns``); a model whose own head runs
        gives its logits whole.

        By default ids and masks come from ``batch``; pass ``input_ids`` or ``inputs_embeds``
        ``[B', N, E]`` (with a matching ``attention_mask``) to run perturbed or expanded copies.
        ``prefix=(states, rows, p)`` (decoders): the rows continue the first ``p`` positions of
        examples ``rows`` ``[B']`` of ``states`` (:meth:`prefix_states`); ``input_ids`` are
        then the positions from ``p`` on, ``attention_mask`` covers all ``p + N'`` positions
        and ``anchor`` counts from ``p``. ``keep_cache`` (decoders): the pass's key/value cache
        is returned in :attr:`Forward.cache` (the prefix's positions included when continuing one).

        Bounded memory (the runner decides, :mod:`heedful.engine.memory`): ``checkpoint`` runs the
        blocks with per-block gradient checkpointing for a backward through this pass, and it,
        ``release`` and ``prefill`` give the heap's free pages back after each block's forward
        and backward (:meth:`checkpointed`); ``prefill`` (decoders, no attention probabilities)
        runs the positions
        in chunks of ``prefill`` with the key/value cache -- attention over ``prefill x N``
        instead of ``N x N`` per block -- with the same outputs (beyond float rounding).
        """
        wanted = active_precision()
        if wanted != self.precision and self.precision == "fp32":  # inside forward_precision(...)
            return self._forward_lowered(
                wanted, batch, anchor, input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                token_type_ids=token_type_ids, hidden_states=hidden_states, attentions=attentions, prefix=prefix,
                checkpoint=checkpoint, release=release, prefill=prefill, keep_cache=keep_cache, head=head,
            )
        mask = batch.attention_mask if attention_mask is None else attention_mask
        kwargs: dict = {"attention_mask": mask, "return_dict": True}
        keep_cache = keep_cache and self.is_decoder
        if self.is_decoder:
            kwargs["use_cache"] = prefix is not None or keep_cache
        if prefix is not None:
            kwargs[self.cache_keyword] = self._prefix_cache(prefix)
        if inputs_embeds is not None:
            kwargs["inputs_embeds"] = inputs_embeds
        else:
            kwargs["input_ids"] = batch.input_ids if input_ids is None else input_ids
        types = batch.token_type_ids if token_type_ids is None else token_type_ids
        if types is not None and self.uses_token_types:
            rows = mask.shape[0]
            kwargs["token_type_ids"] = types if types.shape[0] == rows else types.repeat_interleave(
                rows // types.shape[0], dim=0
            )
        if hidden_states:
            kwargs["output_hidden_states"] = True
        if attentions:
            kwargs["output_attentions"] = True
        device = self.device  # the batch is tokenized on the CPU; the pass runs where the model is
        for key in ("input_ids", "inputs_embeds", "attention_mask", "token_type_ids"):
            if torch.is_tensor(kwargs.get(key)):
                kwargs[key] = kwargs[key].to(device)
        width = (inputs_embeds if inputs_embeds is not None else kwargs["input_ids"]).shape[1]
        chunked = prefill is not None and prefill < width  # chunked prefill runs near the budget
        bounded = (checkpoint or release) and torch.is_grad_enabled() or chunked
        blocks = self.checkpointed(checkpoint, release=True) if bounded else contextlib.nullcontext()
        with self._kernel_attention(not attentions) as fused, blocks, contextlib.ExitStack() as settings:
            if fused and self.is_decoder and not hidden_states and right_padded(mask) and self.unwindowed(width):
                # causal attention never reads right padding: without the padding mask the fused
                # kernel runs its causal path (no [B, H, N, N] mask or scores materialised), aligned
                # to the last key when the pass continues a cache; only padded positions' states
                # change, and none are returned
                kwargs["attention_mask"] = None
                settings.enter_context(attention_set(self.config, CAUSAL_ATTENTION))
            read_inside = hidden_states or attentions or prefix is not None or keep_cache
            run = self._run_model(kwargs, mask, anchor, prefill if chunked else None, read_inside, settings, head=head)
        return Forward(
            logits=run.logits,
            hidden_states=tuple(run.hidden) if hidden_states else None,
            attentions=tuple(run.probs) if attentions else None,
            cache=_prefix_states(run.cache) if keep_cache and run.cache is not None else None,
            head_input=run.head_input,
        )

    def _run_model(
        self,
        kwargs: dict,
        mask: torch.Tensor,
        anchor: torch.Tensor,
        prefill: int | None,
        read_inside: bool,
        settings: contextlib.ExitStack,
        head: bool = True,
    ) -> ModelRun:
        """The pass of :meth:`forward` once its keywords are set (``kwargs``: the backbone's,
        ``mask`` ``[B, N]`` the batch's own): the head's logits at ``anchor`` (``[B, C]``, or
        ``[B, K, C]`` for ``[B, K]`` anchors), every layer's hidden states and attention
        probabilities as the backbone returned them (``None`` where not asked for), the
        backbone's key/value cache (``None`` unless ``kwargs`` use it) and the head's input
        at the anchors (:attr:`Forward.head_input`), the rows counted. ``prefill``: run the positions in chunks of that size (:meth:`_prefilled`);
        ``settings``: the pass's open contexts, which the anchored last block
        (:meth:`_anchored`) joins unless something is ``read_inside`` the model; without
        ``head``, logits with no column."""
        if prefill is not None:
            if kwargs.get("output_attentions"):
                raise InputError("attention probabilities cannot be kept in a forward run in position chunks")
            last, hidden, cache = self._prefilled(kwargs, prefill)
            probs = None
        else:
            settings.enter_context(self._anchored(mask, anchor, read_inside=read_inside))
            out = self.backbone(**kwargs)
            last, hidden, probs = out.last_hidden_state, out.hidden_states, out.attentions
            cache = out.get(self.cache_keyword) if kwargs.get("use_cache") else None
        self.counter.forward += last.shape[0]
        rows = torch.arange(last.shape[0], device=last.device)
        if anchor.dim() == 2:  # a span: K positions per example -> [B, K, C]
            rows = rows[:, None]
        read = last[rows, anchor.to(last.device)]
        return ModelRun(self.head_logits(read) if head else read[..., :0], hidden, probs, cache, read)

    def _prefilled(self, kwargs: dict, size: int) -> tuple[torch.Tensor, list[torch.Tensor] | None, object]:
        """The backbone's pass of ``kwargs`` run ``size`` positions at a time, each chunk
        attending to the key/value cache of the positions before it (chunked prefill; decoders
        only): the last hidden state ``[B, N, D]``, when asked for every layer's hidden
        states ``L + 1`` x ``[B, N, D]``, filled chunk by chunk, and the cache."""
        from transformers import DynamicCache

        if not self.is_decoder:
            raise InputError(f"a {self.family} model has no key/value cache to run positions in chunks with")
        kwargs = dict(kwargs)
        key = "inputs_embeds" if "inputs_embeds" in kwargs else "input_ids"
        inputs, mask = kwargs.pop(key), kwargs.pop("attention_mask")  # None: causal over right padding
        kwargs.pop("use_cache", None)
        name = self.cache_keyword
        cache = kwargs.pop(name, None) or DynamicCache()
        past = cache.get_seq_length()
        width = inputs.shape[1]
        last: torch.Tensor | None = None
        hidden: list[torch.Tensor] | None = None
        for start in range(0, width, size):
            end = min(width, start + size)
            out = self.backbone(
                **kwargs,
                **{key: inputs[:, start:end]},
                attention_mask=None if mask is None else mask[:, : past + end],
                **{name: cache},
                use_cache=True,
            )
            part = out.last_hidden_state
            if last is None:
                last = part.new_empty(part.shape[0], width, part.shape[-1])
                if out.hidden_states is not None:
                    hidden = [h.new_empty(h.shape[0], width, h.shape[-1]) for h in out.hidden_states]
            last[:, start:end] = part
            for full, h in zip(hidden or (), out.hidden_states or (), strict=True):
                full[:, start:end] = h
            del out, part
            release_heap()  # the cache grows by concatenation: give the freed copies back
        return last, hidden, cache

    def _anchored(self, mask: torch.Tensor, anchor: torch.Tensor, read_inside: bool) -> contextlib.AbstractContextManager:
        """The last block computed at ``anchor`` ``[B]`` only (:mod:`heedful.adapters.anchored`)
        when nothing can tell: a no-gradient pass of a classifier or regressor whose family has
        :attr:`anchored_blocks`, one anchor per row, absolute positions, nothing ``read_inside``
        the model (hidden states, attention probabilities, a continued cache), no open
        interception and no hook on the last block; otherwise nothing changes."""
        block = self.blocks[-1] if self.anchored_blocks else None
        if (
            block is None
            or read_inside
            or anchor.dim() != 1
            or torch.is_grad_enabled()
            or self.task not in ("classification", "regression")
            or getattr(self.config, "position_embedding_type", "absolute") != "absolute"
            or self.hf_model.training
            or intercepting(self.hf_model)
            or hooked(block)
        ):
            return contextlib.nullcontext()
        return anchored_last_block(block, self.block_roles(block), mask, anchor.to(mask.device), self.config.num_attention_heads)

    def unwindowed(self, width: int) -> bool:
        """Whether every layer attends to all earlier positions of a ``width``-position pass:
        no layer has a sliding window shorter than ``width`` (Gemma 2 and 3, Mistral, Qwen3 with
        ``use_sliding_window``), so that plain causal attention computes every layer."""
        window = getattr(self.config, "sliding_window", None)
        if not window or getattr(self.config, "use_sliding_window", True) is False:
            return True
        kinds = getattr(self.config, "layer_types", None)
        return width <= int(window) or (kinds is not None and "sliding_attention" not in kinds)

    @contextlib.contextmanager
    def _kernel_attention(self, wanted: bool) -> Iterator[bool]:
        """Inside the block, attention runs as PyTorch's fused ``scaled_dot_product_attention``
        when ``wanted`` and the model otherwise runs plain eager attention: a pass that returns
        no attention probabilities needs no ``[B, H, N, N]`` matrix (memory linear in the
        length on a CPU, and faster). An interception (its own attention) and families that
        compute attention inline are left as they are, and so is any pass inside an open
        interception (its rules see the model exactly as it was built). Yields whether the fused
        kernel runs."""
        config = self.config
        switch = (
            wanted
            and self.kernel_attention
            and getattr(config, "_attn_implementation", None) == "eager"
            and not intercepting(self.hf_model)
        )
        if not switch:
            yield False
            return
        config._attn_implementation = FUSED_ATTENTION
        try:
            yield True
        finally:
            config._attn_implementation = "eager"

    @torch.no_grad()
    def prefix_states(self, batch: Batch) -> PrefixStates:
        """The key/value cache of one pass over ``batch`` (decoders only; right padding leaves
        every real position's states as they are)."""
        if not self.is_decoder:
            raise InputError(f"a {self.family} model has no key/value cache", hint="reuse prefixes with decoders only")
        mask = batch.attention_mask
        causal = right_padded(mask) and self.unwindowed(mask.shape[1])
        with self._kernel_attention(True) as fused, attention_set(self.config, CAUSAL_ATTENTION if fused and causal else None):
            out = self.backbone(
                input_ids=batch.input_ids, attention_mask=None if fused and causal else mask, use_cache=True,
                return_dict=True,
            )
        self.counter.forward += len(batch)
        return _prefix_states(out[self.cache_keyword])

    def _prefix_cache(self, prefix: tuple[PrefixStates, torch.Tensor, int]):
        from transformers import DynamicCache

        states, rows, length = prefix
        cache = DynamicCache()
        every = states.keys[0].shape[0]
        # every example in order: a view of the states, not a gathered copy -- a gather's
        # backward vmapped over cotangents runs once per cotangent
        whole = len(rows) == every and bool(torch.equal(rows, torch.arange(every, device=rows.device)))
        for layer, (keys, values) in enumerate(zip(states.keys, states.values, strict=True)):
            picked = (keys, values) if whole else (keys[rows], values[rows])
            cache.update(*(t[:, :, :length] for t in picked), layer)
        return cache

    def head_logits(self, h: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Head-on-top applied to representations ``h`` ``[M, D]``.

        Without ``columns``: all outputs ``[M, C]`` (C = classes, 1 for regression, V for LMs).
        With ``columns`` ``[M, K]``: only those outputs ``[M, K]`` -- for LM heads this avoids the
        full vocabulary projection.
        """
        if self.task in ("classification", "regression"):
            logits = self.classification_head(h)
            return logits if columns is None else logits.gather(1, columns)
        parts = self.lm_head_parts()
        if columns is None or parts is None:
            logits = self.lm_head_full(h)
            return logits if columns is None else logits.gather(1, columns)
        feats = parts.transform(h)  # [M, E]
        w = parts.weight[columns]  # [M, K, E]
        out = torch.einsum("me,mke->mk", feats, w)
        return parts.capped(out if parts.bias is None else out + parts.bias[columns])

    def head_at_layer(
        self, h: torch.Tensor, layer: int, columns: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Head applied to a layer-``layer`` representation ``[M, D]`` (logit lens).

        ``hidden_states[L]`` already carries the final norm of pre-LN decoders; at intermediate
        layers it is applied here before the head.
        """
        if layer < self.num_layers and self.final_norm is not None:
            h = self.final_norm(h)
        return self.head_logits(h, columns)

    def grad(self, output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """``d sum(output) / d inputs`` (one backward pass over ``output.shape[0]`` sequences)."""
        self.counter.backward += output.shape[0]
        (g,) = torch.autograd.grad(interruptible(output.sum()), inputs)  # Ctrl-C lands mid-pass
        return g
