"""Roles that relevance propagation (LRP) needs, named by an adapter for its family.

LRP rules are written once, in :mod:`heedful.lrp`, as small autograd functions attached to a
model's modules by *role*: every linear map, every normalisation, every element-wise
activation, every residual addition, every gated product, and each block's attention module
(whose attention-probability computation runs through heedful's LRP attention implementation).
An adapter lists those modules in an :class:`LRPRoles`; :mod:`heedful.lrp` never looks inside a
model by attribute name, and the adapter never knows which rules are applied.

The modules' own ``forward`` code stays untouched: rules act through forward hooks (replacing a
module's output by the same value carrying a rule-specific backward) and through the attention
implementation registered with ``transformers``' ``AttentionInterface``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LinearSite:
    """A module computing ``y = x W^T + b`` on its first input.

    ``transposed``: the module stores ``W^T`` (GPT-2's ``Conv1D``), i.e. ``y = x W + b``.
    """

    module: nn.Module
    transposed: bool = False

    def weight(self) -> torch.Tensor:
        """The weight as ``[out, in]``."""
        w = self.module.weight
        return w.T if self.transposed else w


@dataclass(frozen=True)
class NormSite:
    """A normalisation module ``[..., D] -> [..., D]`` on its first input.

    ``kind``: ``"layernorm"`` (``(x - mean) / sqrt(var + eps) * w + b``) or ``"rmsnorm"``
    (``x / sqrt(mean(x^2) + eps) * w``); ``eps`` its stabiliser.
    """

    module: nn.Module
    kind: str
    eps: float

    def __post_init__(self) -> None:
        if self.kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"unknown norm kind {self.kind!r}")


@dataclass(frozen=True)
class ResidualSite:
    """A residual addition ``s = branch(...) + r``: ``branch`` is the module whose output is the
    added branch term; ``source`` is a module whose first input *is* the residual term ``r``
    (the same tensor object), and which runs before ``branch``."""

    branch: nn.Module
    source: nn.Module


@dataclass(frozen=True)
class ProductSite:
    """A gated product ``p = gate_out * up_out`` consumed as the first input of ``consumer``
    (e.g. a gated MLP: ``down(act(gate(x)) * up(x))`` with ``gate`` = the activation module)."""

    gate: nn.Module
    up: nn.Module
    consumer: nn.Module


@dataclass
class BlockRoles:
    """One transformer block.

    ``attention`` is the module the model passes to its attention implementation (the first
    argument of ``eager_attention_forward``); ``rotary`` are the projections whose outputs are
    rotated (rotary position embeddings) before they reach the attention implementation.
    """

    attention: nn.Module
    linears: list[LinearSite]
    norms: list[NormSite]
    activations: list[nn.Module]
    residuals: list[ResidualSite]
    products: list[ProductSite] = field(default_factory=list)
    rotary: list[nn.Module] = field(default_factory=list)


@dataclass
class LRPRoles:
    """Everything relevance propagation touches, from the word embeddings to the head output.

    ``embedding_norms``: norms between the word embeddings and the first block (BERT's embedding
    LayerNorm). ``head_*``: modules after the last block (final norm, pooler, classifier, the
    transform of a masked-LM head). A language-model head's vocabulary projection is *not* a
    module call in heedful (see :meth:`ModelAdapter.lm_head_parts`); relevance methods apply the
    linear rule to it explicitly.
    """

    blocks: list[BlockRoles]
    embedding_norms: list[NormSite] = field(default_factory=list)
    head_linears: list[LinearSite] = field(default_factory=list)
    head_norms: list[NormSite] = field(default_factory=list)
    head_activations: list[nn.Module] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def linears(self) -> Iterator[LinearSite]:
        for block in self.blocks:
            yield from block.linears
        yield from self.head_linears

    def norms(self, embeddings: bool = False) -> Iterator[NormSite]:
        if embeddings:
            yield from self.embedding_norms
        for block in self.blocks:
            yield from block.norms
        yield from self.head_norms

    def activations(self) -> Iterator[nn.Module]:
        for block in self.blocks:
            yield from block.activations
        yield from self.head_activations


def linear_sites(*modules: nn.Module | None, transposed: bool = False) -> list[LinearSite]:
    """:class:`LinearSite` for each module given (``None`` entries skipped)."""
    return [LinearSite(m, transposed) for m in modules if m is not None]
