"""Memory fitting: the model's shape as the memory estimator reads it, how passes of one width
fit the adapter's budget, and blocks run in bounded memory (gradient checkpointing, the heap
given back) -- the :class:`~heedful.adapters.ModelAdapter`'s side of :mod:`heedful.engine.memory`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint as checkpoint_call

from heedful.adapters.intercept import intercepting
from heedful.adapters.passes import attention_set
from heedful.engine.memory import FORWARD, Fit, ModelShape, Need, fit, release_heap


def _released(grad: torch.Tensor) -> None:
    """Gradient hook: give the heap's free pages back (:func:`heedful.engine.memory.release_heap`)."""
    release_heap()


class MemoryFitting:
    """Memory fitting of :class:`~heedful.adapters.ModelAdapter` (mixed into it): reads its
    ``max_memory``, config, blocks and labels."""

    max_memory: int

    @property
    def shape(self) -> ModelShape:
        """The model's shape as the memory estimator reads it (:mod:`heedful.engine.memory`): blocks,
        widths, heads, key/value heads, MLP width, the head's output columns, bytes per value."""
        cfg = self.config

        def first(*names: str) -> int | None:
            found = [getattr(cfg, n, None) for n in names]
            return next((int(v) for v in found if isinstance(v, int) and v > 0), None)

        hidden = self.hidden_size
        heads = first("num_attention_heads", "n_head", "n_heads") or 1
        outputs = len(self.labels) if self.task in ("classification", "regression") else first("vocab_size") or 1
        param = next(self.hf_model.parameters())
        return ModelShape(
            layers=self.num_layers,
            hidden=hidden,
            heads=heads,
            kv_heads=first("num_key_value_heads") or heads,
            head_dim=first("head_dim") or hidden // heads,
            intermediate=first("intermediate_size", "ffn_dim", "n_inner", "hidden_dim") or 4 * hidden,
            outputs=outputs,
            embed=self.word_embeddings.embedding_dim,
            element=param.element_size(),
            decoder=self.is_decoder,
            fused=(
                self.kernel_attention
                and getattr(cfg, "_attn_implementation", None) == "eager"
                and bool(getattr(self.hf_model, "_supports_sdpa", False))
                and not intercepting(self.hf_model)
            ),
        )

    def fit(self, width: int, need: Need = FORWARD, budget: int | None = None, **options) -> Fit:
        """How passes over rows of ``width`` positions keeping ``need`` fit :attr:`max_memory`
        (or a smaller ``budget``; :func:`heedful.engine.memory.fit`: rows per pass, with gradient
        checkpointing or chunked prefill where one row does not fit; ``options``:
        ``checkpoint``, ``prefill``, ``group``). An :class:`InputError` when nothing fits."""
        return fit(self.shape, width, self.max_memory if budget is None else budget, need, **options)

    @contextlib.contextmanager
    def checkpointed(self, checkpoint: bool = True, release: bool = True) -> Iterator[None]:
        """Blocks in bounded memory while inside. With ``checkpoint``, in a pass with gradients,
        each block runs with per-block gradient checkpointing: its forward keeps only its inputs
        and runs again during the backward (``torch.utils.checkpoint``, non-reentrant,
        recomputed with the attention the forward ran; the model is in eval mode, no dropout,
        so the gradients equal the plain backward's). With ``release``, each block gives the
        heap's free pages back after its forward and, with gradients, after its backward
        (:func:`heedful.engine.memory.release_heap`: the tensors a pass keeps for later -- saved
        activations, block inputs, a growing key/value cache -- split the heap, and the next
        block's temporaries do not fit the holes; the pages are faulted in again, about 10% of
        a short pass's time, so only passes near the budget ask for it)."""
        blocks = list(self.blocks)
        own = [block.__dict__.get("forward") for block in blocks]
        config = self.config

        def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
            # the recomputation runs during the backward, after the pass's attention setting
            # (fused or eager, :meth:`_kernel_attention`) was restored: run it as the forward ran
            return contextlib.nullcontext(), attention_set(config, getattr(config, "_attn_implementation", None))

        for block in blocks:
            plain = block.forward

            def run(*args, _plain=plain, **kwargs):
                grad = torch.is_grad_enabled()
                if checkpoint and grad:
                    out = checkpoint_call(_plain, *args, use_reentrant=False, context_fn=contexts, **kwargs)
                else:
                    out = _plain(*args, **kwargs)
                if release:
                    release_heap()
                    entering = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.requires_grad), None)
                    if grad and entering is not None:  # once the block's backward is done, so are its temporaries
                        entering.register_hook(_released)
                return out

            block.forward = run
        try:
            yield
        finally:
            for block, before in zip(blocks, own, strict=True):
                if before is None:
                    del block.forward
                else:
                    block.forward = before
