"""The adapter of a family heedful has not mapped: only what ``transformers`` exposes for every model.

Any ``transformers`` model with a sequence-classification (or regression), masked-LM or
causal-LM head loads with :class:`GenericAdapter` when its ``model_type`` is not in the family
table. It knows the input embeddings (``get_input_embeddings()``), a forward from
``inputs_embeds``, the head through the model's own ``logits``, every layer's hidden states
(``output_hidden_states``) and, where the model returns them under eager attention, the
attention probabilities (``output_attentions``) -- and nothing inside a block. So it provides
the needs ``embeddings``, ``hidden_states``, ``attentions`` (when a probe pass returned them) and
``blocks`` (when one module list holds a module per layer); a method needing block roles, the
head as a module or a relevance rule set is refused before any work
(:mod:`heedful.adapters.needs`).

Whether the model is causal is measured, not read from its name: one probe pass at load over
two rows that differ in their last token; a decoder's first position does not change.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch
from torch import nn

from heedful.adapters.base import ModelAdapter
from heedful.adapters.intercept import Interception
from heedful.adapters.needs import NEEDS
from heedful.adapters.passes import ModelRun
from heedful.adapters.roles import ModelRoles
from heedful.errors import InputError, UnsupportedModelError

CLASSIFIER_TASKS = ("classification", "regression")
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
"""Config attributes that give the number of blocks, in the order they are tried."""


@functools.cache
def _cache_keyword(model: type[nn.Module]) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _row_slice(value, rows: torch.Tensor, width: int, batch: int):
    """``value`` cut to ``rows`` and its first ``width`` positions when it is a per-row tensor
    ``[batch, N, ...]``; as it is otherwise."""
    if torch.is_tensor(value) and value.dim() >= 2 and value.shape[0] == batch:
        return value[rows.to(value.device), :width]
    return value


class GenericAdapter(ModelAdapter):
    """A model of a family without roles, run as ``transformers`` runs it (see the module
    docstring). ``model_type`` names the family in messages."""

    family = "generic"
    kernel_attention = False  # the model's own attention code may not read the implementation switch

    def __post_init__(self) -> None:
        config = self.hf_model.config
        if self.task in CLASSIFIER_TASKS and getattr(config, "pad_token_id", None) is None:
            # a decoder classifier finds each row's last token by the pad id, and refuses batches without one
            config.pad_token_id = getattr(self.tokenizer, "pad_token_id", None)
        self.model_type = str(getattr(config, "model_type", None) or type(self.hf_model).__name__)
        self._causal = self.task == "causal_lm"
        self._given: frozenset[str] = frozenset()
        super().__post_init__()
        self._given = self._probe()

    # ------------------------------------------------------------------ what it knows
    @property
    def is_decoder(self) -> bool:  # type: ignore[override]
        return self._causal

    @property
    def described(self) -> str:
        return f"the {self.model_type} family ({type(self.hf_model).__name__}, generic adapter)"

    def provides(self, need: str) -> bool:
        if need not in NEEDS:
            raise ValueError(f"unknown need {need!r} (one of {', '.join(NEEDS)})")
        return need in self._given

    @property
    def layer_count(self) -> int | None:
        """The number of blocks the config records (its text config for multimodal models)."""
        config = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        found = (getattr(config, name, None) for name in LAYER_COUNTS)
        return next((int(v) for v in found if isinstance(v, int) and v > 0), None)

    @functools.cached_property
    def _blocks(self) -> list[nn.Module]:
        count = self.layer_count
        for module in self.backbone.modules():
            if isinstance(module, nn.ModuleList) and count is not None and len(module) == count:
                return list(module)
        return []

    @property
    def blocks(self) -> Sequence[nn.Module]:
        """The first module list below the backbone holding one module per layer (empty when
        there is none: layers shared or nested)."""
        return self._blocks

    @property
    def num_layers(self) -> int:
        return self.layer_count or len(self._blocks)

    @property
    def cache_keyword(self) -> str:
        return _cache_keyword(type(self.hf_model))

    def roles(self) -> ModelRoles:
        raise UnsupportedModelError(f"the block roles of {self.described} are not mapped", hint="see docs/extending.md")

    def intercept(self) -> Interception:
        """An interception without role names: sites of :attr:`blocks` (e.g. the first
        block's input) can still be hooked (:meth:`Interception.at`)."""
        return Interception(self.hf_model)

    def head_logits(self, h: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        raise UnsupportedModelError(
            f"the head of {self.described} is known only through the model's own outputs", hint="see docs/extending.md"
        )

    def _check_roles(self) -> None:
        """The head is the model's own; :meth:`_probe` runs it."""

    def _probe(self) -> frozenset[str]:
        """One pass over two 3-token rows differing in their last token: the needs the model
        meets, and whether it is causal (its first position does not see the last)."""
        vocab = int(getattr(self.config, "vocab_size", None) or self.word_embeddings.num_embeddings)
        ids = torch.tensor([[1, 2, 3], [1, 2, 4]], device=self.device) % vocab
        mask = torch.ones_like(ids)
        try:
            with torch.no_grad():
                out = self.hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, return_dict=True)
        except Exception as exc:  # noqa: BLE001  (a model that cannot run at all: transformers raises many kinds)
            raise UnsupportedModelError(
                f"{type(self.hf_model).__name__} does not run on a plain batch of ids ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                hint="load it with attn_implementation='eager' and a sequence-classification, masked-LM or causal-LM head",
            ) from None
        if getattr(out, "logits", None) is None:
            raise UnsupportedModelError(f"{type(self.hf_model).__name__} returns no logits", hint="load a checkpoint with a head")
        given = {"embeddings"}
        hidden, attentions = getattr(out, "hidden_states", None), getattr(out, "attentions", None)
        layers = self.num_layers
        if hidden is not None and len(hidden) == layers + 1 and all(h.shape[:2] == (2, 3) for h in hidden):
            given.add("hidden_states")  # one state per token at every layer (no pooled layers)
            if not self._causal and self.task != "masked_lm":
                change = (hidden[-1][0] - hidden[-1][1]).float().norm(dim=-1)  # [3] per position
                self._causal = bool(change[0] <= 1e-4 * change[2])
        if attentions is not None and len(attentions) == layers and all(
            torch.is_tensor(a) and a.dim() == 4 and a.shape[-2:] == (3, 3) for a in attentions
        ):
            given.update(("attentions", "attention_flow"))
        if self._blocks:
            given.add("blocks")
        return frozenset(given)

    # ------------------------------------------------------------------ passes
    def _run_model(self, kwargs, mask, anchor, prefill, read_inside, settings, head=True):
        """The whole model's pass (:meth:`ModelAdapter._run_model`): its own head gives the
        logits (whole, ``head`` or not). A language model's output projection sees only the anchor positions (a hook
        on ``get_output_embeddings()``), so no ``[B, N, V]`` tensor is made; a decoder
        classifier's rows of different lengths run in groups of equal length when the model
        could not find each row's last token from its ids (it reads the last position of
        ``inputs_embeds``). ``prefill`` is ignored: the whole model runs at once. A language
        model's key/value cache is returned when the keywords use one; a classifier's is not."""
        kwargs = {k: v for k, v in kwargs.items() if v is not None or k == "attention_mask"}
        if self.task in CLASSIFIER_TASKS:
            return ModelRun(*self._classified(kwargs, mask, anchor), None)
        logits, out = self._lm_pass(kwargs, mask.shape[0], anchor)
        return ModelRun(logits, out.hidden_states, out.attentions, getattr(out, "past_key_values", None) if kwargs.get("use_cache") else None)

    def _lm_pass(self, kwargs: dict, count: int, anchor: torch.Tensor):
        """The whole language model run on ``kwargs`` (``count`` rows) with its output projection
        reading only ``anchor`` (``[B]``, or ``[B, K]`` for a span): the logits there (``[B, V]``
        or ``[B, K, V]``) and the model's output."""
        rows = torch.arange(count, device=self.device)
        where = anchor.to(self.device)
        where = where if where.dim() == 2 else where[:, None]
        projection = self.hf_model.get_output_embeddings()
        picked = []

        def gather(module: nn.Module, args: tuple):
            h = args[0]
            if picked or not torch.is_tensor(h) or h.dim() != 3 or h.shape[0] != rows.shape[0]:
                return None
            picked.append(True)
            return (h[rows[:, None], where], *args[1:])

        handle = projection.register_forward_pre_hook(gather) if isinstance(projection, nn.Module) else None
        try:
            out = self.hf_model(**kwargs)
        finally:
            if handle is not None:
                handle.remove()
        self.counter.forward += count
        logits = out.logits if picked else out.logits[rows[:, None], where]
        return (logits if anchor.dim() == 2 else logits[:, 0]), out

    def _classified(self, kwargs: dict, mask: torch.Tensor, anchor: torch.Tensor):
        """A classifier's or regressor's pass: the model pools as it was trained to (its first
        token, its mean); a decoder's logits are read at each row's anchor (its last real
        token) from the head's per-position outputs, which a hook takes from the module of the
        model that gives ``[B, N, C]`` -- or, for a model without one, from passes over groups
        of rows of equal length."""
        batch, width = mask.shape
        if not self._causal:
            out = self.hf_model(**kwargs)
            self.counter.forward += batch
            # an encoder–decoder classifier (BART's) returns its states per stack, under other names
            return out.logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None)
        found: list[torch.Tensor] = []
        classes = int(getattr(self.config, "num_labels", 1))
        given = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        computed = given.shape[1]  # the positions this pass runs (after a continued cache's)

        def per_position(module: nn.Module, args: tuple, output) -> None:
            if torch.is_tensor(output) and output.dim() == 3 and output.shape == (batch, computed, classes):
                found.append(output)

        heads = [m for name, m in self.hf_model.named_children() if m is not self.backbone]
        handles = [m.register_forward_hook(per_position) for m in heads]
        try:
            out = self.hf_model(**kwargs)
        finally:
            for handle in handles:
                handle.remove()
        lengths = mask.sum(dim=1)
        if len(found) == 1 or bool((lengths == width).all()):
            self.counter.forward += batch
            rows = torch.arange(batch, device=self.device)
            logits = found[0][rows, anchor.to(self.device)] if found else out.logits
            return logits, out.hidden_states, out.attentions
        if self.cache_keyword in kwargs:
            raise InputError(f"a {self.model_type} classifier's rows of different lengths cannot continue a key/value cache")
        parts: list = []
        order: list[torch.Tensor] = []
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero().flatten()
            parts.append(self.hf_model(**{k: _row_slice(v, rows, int(length), batch) for k, v in kwargs.items()}))
            order.append(rows)
        self.counter.forward += 2 * batch
        back = torch.cat(order).argsort().to(self.device)
        logits = torch.cat([o.logits for o in parts])[back]
        return logits, self._regrouped(parts, "hidden_states", back, width), self._regrouped(parts, "attentions", back, width)

    @staticmethod
    def _regrouped(parts: list, name: str, back: torch.Tensor, width: int) -> tuple[torch.Tensor, ...] | None:
        """Per-layer tensors of groups of rows ``[R_g, ..., n_g]`` padded with zeros to
        ``width`` in their position dimensions and put back in row order."""
        found = [getattr(o, name, None) for o in parts]
        if any(f is None for f in found):
            return None
        layers = []
        for per_group in zip(*found, strict=True):
            padded = []
            for t in per_group:
                n = t.shape[-2]
                pad = (0, width - n, 0, width - n) if name == "attentions" else (0, 0, 0, width - n)
                padded.append(nn.functional.pad(t, pad))
            layers.append(torch.cat(padded)[back])
        return tuple(layers)
