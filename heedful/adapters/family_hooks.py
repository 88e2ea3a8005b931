"""The family hooks: what an adapter subclass says about one architecture (see :class:`FamilyHooks`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

import torch
from torch import nn

from heedful.adapters.roles import BlockRoles, HeadRoles, ModelRoles, NormSite
from heedful.errors import UnsupportedModelError


@dataclass
class LMHeadParts:
    """A language-model head split as ``logits = cap(transform(h) @ weight.T + bias)``, so that a
    few vocabulary columns can be computed without the full vocabulary projection; ``softcap``
    ``c``: the logits are soft-capped, ``cap(z) = tanh(z / c) * c`` (Gemma 2), else ``cap`` is
    the identity."""

    transform: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor
    bias: torch.Tensor | None
    softcap: float | None = None

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


class FamilyHooks:
    """The family guide: everything a :class:`~heedful.adapters.ModelAdapter` subclass fills in
    for one architecture. Methods never name an architecture; they read what these hooks return.

    Subclass :class:`~heedful.adapters.ModelAdapter` (or a family close to yours:
    ``heedful.adapters.families.LlamaAdapter`` for a Llama-shaped decoder, ``BertAdapter`` for a
    BERT-shaped encoder), set the class attributes, write the methods below that differ, then
    ``heedful.adapters.register_family(model_type, YourAdapter)`` and prove it with
    ``heedful.testing.check_family`` (docs/extending.md, Families).

    Class attributes (where things are, read from ``backbone``, the model without its head):

    - ``family``: the family's name in messages and tables (``"llama"``).
    - ``is_decoder``: a causal model -- the anchor is the last real token, removal is deletion,
      the passes may continue a key/value cache.
    - ``blocks_at``: the attribute path below ``backbone`` of the blocks' ``nn.ModuleList``, in
      forward order (``"encoder.layer"``, ``"layers"``, ``"h"``); :attr:`blocks` reads it.
    - ``final_norm_at``: the path of the norm a pre-LN model applies after the last block
      (``"norm"``); empty: none. :attr:`final_norm` reads it.
    - ``token_types``: whether the model embeds segment (token type) ids; ``None``: the config's
      ``type_vocab_size`` says.
    - ``relevance_rules``: the relevance rule sets (:data:`heedful.lrp.rules.RULE_SETS` names)
      ``check_family`` checked on these blocks; the others are refused. Empty until checked.
    - ``kernel_attention``: passes without attention probabilities may run fused attention
      (``sdpa``); ``False`` where the family's attention code does not read the switch.
    - ``anchored_blocks``: the blocks are post-LN BERT-shaped encoder blocks whose last one
      :mod:`heedful.adapters.anchored` may compute at the anchors only.

    Methods (``h`` is a batch of representations ``[M, D]``, one per row):

    - :meth:`block_roles` ``(layer) -> BlockRoles``: where every role of one block lives -- the
      ``query`` / ``key`` / ``value`` projection outputs (a fused projection's ``columns``, per
      head ``stride``), ``probs``, ``context``, ``attn_out``, the norms (``attn_norm``,
      ``mlp_norm`` and where ``pre_ln`` puts them), ``mlp_in`` / ``mlp_gate`` / ``mlp_up`` /
      ``mlp_act`` / ``mlp_out``, and what a block adds to a plain one (``query_norm``,
      ``attn_post_norm``, ``parallel``, ``experts``; the table in
      :mod:`heedful.adapters.roles`). Every family fills this in.
    - :meth:`classification_head` ``(h) -> [M, C]``: a sequence classifier's head (pooler
      included) applied to any representation.
    - :meth:`lm_head_parts` ``() -> LMHeadParts | None``: a language model's head as transform,
      weight ``[V, E]`` and bias, so a few columns are computed without the whole vocabulary;
      or override :meth:`lm_head_full` ``(h) -> [M, V]`` where the head does not split.
    - :meth:`head_roles` ``() -> HeadRoles``: the head's linear maps, norms and activations,
      and its ``steps`` from a representation to the outputs (relevance propagation and the
      decomposition methods follow them).
    - :meth:`embedding_norm_sites` ``() -> list[NormSite]``: norms between the word embeddings
      and the first block (BERT's embedding LayerNorm); default none.
    - :meth:`final_norm_site` ``() -> NormSite | None``: :attr:`final_norm` as a role.
    - :attr:`backbone`: override only where the model's ``base_model`` is not the transformer
      that takes ``input_ids`` or ``inputs_embeds``.
    """

    hf_model: nn.Module

    family: ClassVar[str] = "generic"
    is_decoder: ClassVar[bool] = False
    blocks_at: ClassVar[str] = ""
    """Where the blocks are: an attribute path below the backbone (``"encoder.layer"``)."""
    final_norm_at: ClassVar[str] = ""
    """Where a pre-LN decoder's final norm is, below the backbone (``"norm"``); empty: none."""
    token_types: ClassVar[bool | None] = None
    """Whether the model embeds segment (token type) ids; ``None``: its config says."""
    relevance_rules: ClassVar[frozenset[str]] = frozenset()
    """The relevance rule sets (:data:`heedful.lrp.rules.RULE_SETS` names) checked against this
    family's blocks (by ``heedful.testing.check_family``); the others are refused."""
    kernel_attention: ClassVar[bool] = True
    """Passes without attention probabilities may run fused attention (``sdpa``)."""
    anchored_blocks: ClassVar[bool] = False
    """The blocks are post-LN encoder blocks that :mod:`heedful.adapters.anchored` computes at
    the anchor positions only (forward-only passes of a classifier or regressor)."""

    @property
    def backbone(self) -> nn.Module:
        """The transformer without its head; accepts ``input_ids`` or ``inputs_embeds``."""
        return self.hf_model.base_model

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.hf_model.get_input_embeddings()

    @property
    def final_norm(self) -> nn.Module | None:
        """Norm that pre-LN decoders apply after the last block (``None`` for post-LN encoders):
        the module at :attr:`final_norm_at` below the backbone."""
        return attrgetter(self.final_norm_at)(self.backbone) if self.final_norm_at else None

    @property
    def blocks(self) -> Sequence[nn.Module]:
        """The transformer blocks, in forward order: the module at :attr:`blocks_at` below the
        backbone."""
        if not self.blocks_at:
            raise UnsupportedModelError(f"the {self.family} adapter does not say where its blocks are")
        return attrgetter(self.blocks_at)(self.backbone)

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        """Head-on-top of a sequence classifier applied to representations ``[M, D]`` -> ``[M, C]``."""
        raise UnsupportedModelError(f"{self.family} adapter has no classification head role")

    def lm_head_parts(self) -> LMHeadParts | None:
        """The LM head split into transform and projection (``None``: only the full head is known)."""
        return None

    def lm_head_full(self, h: torch.Tensor) -> torch.Tensor:
        """Full LM head ``[M, D] -> [M, V]``."""
        parts = self.lm_head_parts()
        if parts is None:
            raise UnsupportedModelError(f"{self.family} adapter has no language-model head role")
        logits = parts.transform(h) @ parts.weight.T
        return parts.capped(logits if parts.bias is None else logits + parts.bias)

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Where each role of one block lives (a family fills this in)."""
        raise UnsupportedModelError(f"the roles of the {self.family} family are not mapped")

    def embedding_norm_sites(self) -> list[NormSite]:
        """Norms between the word embeddings and the first block."""
        return []

    def final_norm_site(self) -> NormSite | None:
        """The norm pre-LN decoders apply after the last block, as a role."""
        return None

    def head_roles(self) -> HeadRoles:
        """The modules of the head-on-top."""
        return HeadRoles()

    def roles(self) -> ModelRoles:
        """Where each role lives in the model (see :mod:`heedful.adapters.roles`): one
        :meth:`block_roles` per block, the embedding norms, the final norm and the head."""
        return ModelRoles(
            blocks=[self.block_roles(layer) for layer in self.blocks],
            embedding_norms=self.embedding_norm_sites(),
            final_norm=self.final_norm_site(),
            head=self.head_roles(),
        )
