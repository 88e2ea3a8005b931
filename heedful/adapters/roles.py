"""Roles: where each part of a transformer lives inside a ``transformers`` model.

An adapter describes its family once, as :class:`ModelRoles`: per block a :class:`BlockRoles`
naming where each tensor of the block passes (a :class:`Site`), plus the embedding norms, the
final norm and the head's modules. Everything that reaches inside a model -- the interception
context (:mod:`heedful.adapters.intercept`), relevance propagation (:mod:`heedful.lrp`) -- works
from these roles and never names an architecture attribute.

Per-block roles (``B`` examples, ``N`` query positions, ``M`` key positions, ``D`` model width,
``H`` heads of width ``d``, ``Hkv`` key/value heads, ``F`` MLP width):

============  ===========================================================  ==================
role          tensor                                                       shape
============  ===========================================================  ==================
block_in      residual stream entering the block (``hidden_states[l]``)    ``[B, N, D]``
query         query projection output (before rotary positions / scaling)  ``[B, N, H*d]``
key, value    key / value projection outputs                               ``[B, M, Hkv*d]``
probs         attention probabilities (row = query)                        ``[B, H, N, M]``
context       merged heads entering the attention output projection        ``[B, N, H*d]``
attn_out      attention output projection                                  ``[B, N, D]``
attn_norm     norm at the attention sub-layer (pre- or post-LN)            ``[B, N, D]``
mlp_in        MLP input                                                    ``[B, N, D]``
mlp_gate      gate projection of a gated MLP (Llama family only)           ``[B, N, F]``
mlp_up        first (up) projection of the MLP                             ``[B, N, F]``
mlp_act       activation output                                            ``[B, N, F]``
mlp_out       MLP output projection                                        ``[B, N, D]``
mlp_norm      norm at the MLP sub-layer (pre- or post-LN)                  ``[B, N, D]``
block_out     residual stream leaving the block (``hidden_states[l+1]``)   ``[B, N, D]``
============  ===========================================================  ==================

``BlockRoles.pre_ln`` says where the norms sit: pre-LN blocks (GPT-2, OPT with
``do_layer_norm_before``, the Llama family) normalise the residual stream at the entrance of each
sub-layer (``x + f(norm(x))``); post-LN blocks (BERT-style encoders, OPT-350m) normalise after the
residual addition (``norm(x + f(x))``).

Relevance propagation needs a flatter view -- every linear map, norm, activation, residual
addition and gated product -- which :meth:`ModelRoles.lrp` derives from the same roles
(:class:`LRPRoles`).

The head is described twice: as the sets of modules relevance propagation attaches rules to
(:class:`HeadRoles` ``linears``, ``norms``, ``activations``) and as the ordered chain of
operations that maps one token's representation to the outputs (``HeadRoles.steps``: linear
maps, norms, elementwise activations, ending with the output projection), which the
decomposition methods push token contributions through (:mod:`heedful.attribution.decomposition`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from heedful.errors import UnsupportedModelError

Side = Literal["input", "output", "attention"]

ROLES: tuple[str, ...] = (
    "block_in",
    "query",
    "key",
    "value",
    "probs",
    "context",
    "attn_out",
    "attn_norm",
    "mlp_in",
    "mlp_gate",
    "mlp_up",
    "mlp_act",
    "mlp_out",
    "mlp_norm",
    "block_out",
)
"""Every per-block role, in forward order (see the module docstring for shapes)."""


@dataclass(frozen=True)
class Site:
    """Where a tensor passes: the first input (``side="input"``) or the output (``"output"``; the
    first element of a tuple output) of ``module``; or (``"attention"``) the attention
    probabilities ``[B, H, N, M]`` that the attention implementation computes for ``module``, the
    module ``transformers`` passes to ``ALL_ATTENTION_FUNCTIONS``.

    ``columns``: only features ``[start, stop)`` of the last dimension (GPT-2's fused QKV
    projection); with ``stride``, features ``[start, stop)`` of every group of ``stride``
    features (GPT-NeoX's fused projection keeps query, key and value side by side per head:
    ``[..., H, 3 * d]``, the query is ``[0, d)`` of each group of ``3 * d``). ``heads``: the last dimension holds that many heads, head-major
    (``[..., H * d]``, as ``transformers`` splits it with ``view(..., H, d)``). ``layout``: the module
    sees the tokens flattened to ``[B * N, ...]`` (OPT's MLP); ``layout``'s first input is
    ``[B, N, D]`` and gives ``B`` and ``N``. ``first_call_within``: only the first call of
    ``module`` during each call of that module counts (DeBERTa-v2 applies its query and key
    projections again to the relative-position embeddings, ``DisentangledSelfAttention``).
    """

    module: nn.Module
    side: Side = "output"
    columns: tuple[int, int] | None = None
    heads: int | None = None
    layout: nn.Module | None = None
    first_call_within: nn.Module | None = None
    stride: int | None = None

    def take(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The features of ``t`` along ``dim`` this site keeps (all without ``columns``): the
        site's slice of a module output ``[..., out]``, or of its weight ``[out, in]`` (``dim=0``)
        and bias ``[out]``."""
        if self.columns is None:
            return t
        start, stop = self.columns
        if self.stride is None:
            return t.narrow(dim, start, stop - start)
        dim = dim % t.dim()
        grouped = t.unflatten(dim, (-1, self.stride))
        return grouped.narrow(dim + 1, start, stop - start).flatten(dim, dim + 1)

    def put(self, t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``t`` ``[..., out]`` with this site's features (:meth:`take`) replaced by ``new``."""
        if self.columns is None:
            return new
        start, stop = self.columns
        if self.stride is None:
            return torch.cat([t[..., :start], new, t[..., stop:]], dim=-1)
        grouped, parts = t.unflatten(-1, (-1, self.stride)), new.unflatten(-1, (-1, stop - start))
        return torch.cat([grouped[..., :start], parts, grouped[..., stop:]], dim=-1).flatten(-2)


# ---------------------------------------------------------------------- operations (LRP view)
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

    @property
    def output(self) -> Site:
        return Site(self.module)


@dataclass(frozen=True)
class NormSite:
    """A normalisation module ``[..., D] -> [..., D]`` on its first input.

    ``kind``: ``"layernorm"`` (``(x - mean) / sqrt(var + eps) * w + b``) or ``"rmsnorm"``
    (``x / sqrt(mean(x^2) + eps) * w``); ``eps`` its stabiliser; ``layout`` as in :class:`Site`;
    ``offset``: the gain is ``offset + w`` (Gemma's norms scale by ``1 + w``).
    """

    module: nn.Module
    kind: str
    eps: float
    layout: nn.Module | None = None
    offset: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"unknown norm kind {self.kind!r}")

    def gain(self) -> torch.Tensor | None:
        """The elementwise gain ``[D]`` the normalised vector is multiplied by (``None``: none)."""
        weight = getattr(self.module, "weight", None)
        if weight is None or not self.offset:
            return weight
        return weight + self.offset

    @property
    def output(self) -> Site:
        return Site(self.module, layout=self.layout)


@dataclass(frozen=True)
class ResidualSite:
    """A residual addition ``s = branch(...) + r``: ``branch`` is the module whose output is the
    added branch term; ``source`` is a module whose first input *is* the residual term ``r``
    (the same tensor object), and which runs before ``branch``. ``also``: modules whose outputs
    are further terms of the same sum, run before ``branch`` (a parallel block's attention:
    ``s = mlp(...) + attn(...) + r``)."""

    branch: nn.Module
    source: nn.Module
    also: tuple[nn.Module, ...] = ()
    attention: int | None = None
    """Which term of ``(branch, *also)`` is the attention sub-layer's (``None``: none is)."""


@dataclass(frozen=True)
class ProductSite:
    """A gated product ``p = gate_out * up_out`` consumed as the first input of ``consumer``
    (e.g. a gated MLP: ``down(act(gate(x)) * up(x))`` with ``gate`` = the activation module);
    ``up`` is a :class:`Site`, so that it can be a column range of a fused projection (Phi-3's
    ``gate_up_proj``)."""

    gate: nn.Module
    up: Site
    consumer: nn.Module


@dataclass(frozen=True)
class ExpertsSite:
    """The experts of a sparse mixture of experts: ``module`` computes ``sum_k w_k E_k(x)``
    from the tokens ``x`` (its first input, ``[T, D]``) and the weights ``w`` the router gave
    the experts it chose; every expert is a gated MLP ``down(act(gate(x)) * up(x))`` whose
    activation is the module ``act``. The router is the model's own computation (ordinary
    gradient)."""

    module: nn.Module
    act: nn.Module


@dataclass(frozen=True)
class Activation:
    """An elementwise activation of the head applied as a function ``fn`` (``[..., F] ->
    [..., F]``): a module (BERT's pooler ``Tanh``) or a plain function (RoBERTa's ``torch.tanh``)."""

    fn: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Projection:
    """``y = x W^T + b`` from tensors: ``weight`` ``[out, in]``, ``bias`` ``[out]`` or ``None`` (a
    projection that is no module call, e.g. a vocabulary projection tied to the word embeddings)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


HeadStep = LinearSite | NormSite | Activation | Projection
"""One operation of the head chain (:attr:`HeadRoles.steps`)."""


@dataclass
class LRPBlock:
    """One transformer block as relevance propagation sees it: its operations.

    ``attention`` is the module the model passes to its attention implementation (the first
    argument of ``eager_attention_forward``); ``rotary`` are the sites (a projection's output,
    a column range of a fused one, or a query / key norm's output) whose values are rotated
    (rotary position embeddings) before they reach the attention implementation, with nothing
    but the rotation in between.
    """

    attention: nn.Module
    linears: list[LinearSite]
    norms: list[NormSite]
    activations: list[nn.Module]
    residuals: list[ResidualSite]
    products: list[ProductSite] = field(default_factory=list)
    rotary: list[Site] = field(default_factory=list)
    experts: list[ExpertsSite] = field(default_factory=list)
    """The block's mixture of experts (at most one): its MLP is ``sum_k w_k E_k(x)``."""


@dataclass
class LRPRoles:
    """Everything relevance propagation touches, from the word embeddings to the head output.

    ``embedding_norms``: norms between the word embeddings and the first block (BERT's embedding
    LayerNorm). ``head_*``: modules after the last block (final norm, pooler, classifier, the
    transform of a masked-LM head). A language-model head's vocabulary projection is *not* a
    module call in heedful (see :meth:`ModelAdapter.lm_head_parts`); relevance methods apply the
    linear rule to it explicitly.
    """

    blocks: list[LRPBlock]
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


# ---------------------------------------------------------------------- named roles
MISSING: dict[str, str] = {
    "mlp_gate": "no gated MLP",
    "mlp_up": "a mixture of experts: no single MLP",
    "mlp_act": "a mixture of experts: no single MLP",
    "attn_norm": "no norm before its attention",
    "mlp_norm": "no norm before its MLP",
}
"""Why a block may lack a role (the error :meth:`BlockRoles.site` gives)."""


@dataclass(frozen=True)
class BlockRoles:
    """One block's named roles (see the module docstring for each tensor and its shape).

    ``block``: the block module (its first input and its output are the residual stream).
    ``attention``: the module passed to the attention implementation, or the one computing the
    probabilities inline (DeBERTa-v2). The projection roles (``query`` ... ``mlp_out``) are outputs
    of linear modules, except ``context`` and ``mlp_in`` (inputs); ``transposed``: those linear
    modules store ``W^T`` (GPT-2's ``Conv1D``). ``rotary``: query and key are rotated (rotary
    position embeddings) between their projection (and ``query_norm`` / ``key_norm``) and the
    attention implementation.
    ``mlp_gate``: the gate projection of a gated MLP, ``act(gate(x)) * up(x)``; ``None`` otherwise.

    Beyond the plain pre-LN (``x + f(norm(x))``) and post-LN (``norm(x + f(x))``) block:
    ``attn_norm`` / ``mlp_norm`` ``None``: the sub-layer reads the stream without a norm (OLMo 2,
    ModernBERT's first block); ``attn_post_norm`` / ``mlp_post_norm``: a norm on the sub-layer's
    output before the residual addition (``x + norm(f(...))``: Gemma 2 and 3's sandwich norms,
    OLMo 2); ``query_norm`` / ``key_norm``: norms on the query and key projections before the
    rotation (Qwen3, Gemma 3, OLMo 2); ``parallel``: attention and MLP both read the block
    input, ``x + attn(n1(x)) + mlp(n2(x))`` (GPT-NeoX / Pythia); ``experts``: the MLP is a
    sparse mixture of experts (:class:`ExpertsSite`; the MoE block's input is ``mlp_in``, its
    output ``mlp_out``; ``mlp_up`` and ``mlp_act`` ``None``: Mixtral, Qwen3-MoE).
    """

    block: nn.Module
    attention: nn.Module
    query: Site
    key: Site
    value: Site
    probs: Site
    context: Site
    attn_out: Site
    attn_norm: NormSite | None
    mlp_in: Site
    mlp_up: Site | None
    mlp_act: Site | None
    mlp_out: Site
    mlp_norm: NormSite | None
    pre_ln: bool
    mlp_gate: Site | None = None
    transposed: bool = False
    rotary: bool = False
    attn_post_norm: NormSite | None = None
    mlp_post_norm: NormSite | None = None
    query_norm: NormSite | None = None
    key_norm: NormSite | None = None
    parallel: bool = False
    experts: ExpertsSite | None = None

    def site(self, role: str) -> Site:
        """Where ``role`` (one of :data:`ROLES`) passes in this block."""
        if role == "block_in":
            return Site(self.block, "input")
        if role == "block_out":
            return Site(self.block, "output")
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; the roles are: {', '.join(ROLES)}")
        found = getattr(self, role)
        if found is None:
            raise UnsupportedModelError(f"this block has no {role!r} ({MISSING.get(role, 'not mapped')})")
        return found.output if isinstance(found, NormSite) else found

    def has(self, role: str) -> bool:
        """Whether this block has ``role`` (one of :data:`ROLES`)."""
        return role in ("block_in", "block_out") or getattr(self, role) is not None

    def unplain(self) -> list[str]:
        """What this block has beyond a plain pre-LN or post-LN block with one MLP (empty: a
        plain block), in words, for refusals of methods that follow only plain blocks."""
        found = {
            "norms on the sub-layer outputs (sandwich norms)": self.attn_post_norm is not None or self.mlp_post_norm is not None,
            "a sub-layer without a norm": self.attn_norm is None or self.mlp_norm is None,
            "attention and MLP in parallel": self.parallel,
            "a mixture of experts": self.experts is not None,
        }
        return [what for what, present in found.items() if present]

    def lrp(self) -> LRPBlock:
        """The block's operations: every linear map (a fused projection once), every norm, the
        activation, the residual additions (one three-term addition in a parallel block) and,
        for a gated MLP, the gated product; the rotated sites carry their column ranges."""
        routed = self.experts is not None  # the MoE block's output is no linear map: its experts are
        projections = (self.query, self.key, self.value, self.attn_out, self.mlp_gate, self.mlp_up, None if routed else self.mlp_out)
        modules = dict.fromkeys(site.module for site in projections if site is not None)
        found = (self.attn_norm, self.mlp_norm, self.attn_post_norm, self.mlp_post_norm, self.query_norm, self.key_norm)
        norms = list({id(n.module): n for n in found if n is not None}.values())  # a shared norm once (Phi)
        # the residual term r is the first input of the norm (pre-LN) or of the sub-layer (post-LN, no norm)
        attn_source = self.attn_norm.module if self.pre_ln and self.attn_norm is not None else self.attention
        mlp_source = self.mlp_norm.module if self.pre_ln and self.mlp_norm is not None else self.mlp_in.module
        attn_branch = (self.attn_post_norm or self.attn_out).module
        mlp_branch = (self.mlp_post_norm or self.mlp_out).module
        if self.parallel:  # x + attn(n1(x)) + mlp(n2(x)): one sum, the MLP's term computed last
            residuals = [ResidualSite(mlp_branch, attn_source, also=(attn_branch,), attention=1)]
        else:
            residuals = [ResidualSite(attn_branch, attn_source, attention=0), ResidualSite(mlp_branch, mlp_source)]
        gated = self.mlp_gate is not None
        rotated = [norm.output if norm is not None else site for site, norm in ((self.query, self.query_norm), (self.key, self.key_norm))]
        return LRPBlock(
            attention=self.attention,
            linears=linear_sites(*modules, transposed=self.transposed),
            norms=norms,
            activations=[self.experts.act if routed else self.mlp_act.module],
            residuals=residuals,
            products=[ProductSite(self.mlp_act.module, self.mlp_up, self.mlp_out.module)] if gated else [],
            rotary=rotated if self.rotary else [],
            experts=[self.experts] if routed else [],
        )


@dataclass(frozen=True)
class HeadRoles:
    """Modules between the last block's output and the head's output (pooler, classifier, the
    transform of a masked-LM head, OPT's output projection). Activations applied as plain
    functions (``torch.tanh`` in RoBERTa's classifier) are not modules and are not listed.

    ``steps``: the same head as an ordered chain applied to one token's representation at the
    anchor ``[M, D]`` (after a pre-LN decoder's final norm, :attr:`ModelRoles.final_norm`) --
    every linear map, norm and elementwise activation in forward order, the last step the
    output projection ``[M, C]`` (classes, or the vocabulary) -- with the function activations
    included and dropout (inactive in eval mode) left out. Empty: the head is not described."""

    linears: list[LinearSite] = field(default_factory=list)
    norms: list[NormSite] = field(default_factory=list)
    activations: list[nn.Module] = field(default_factory=list)
    steps: tuple[HeadStep, ...] = ()


@dataclass(frozen=True)
class ModelRoles:
    """A model's roles: ``blocks`` in forward order, ``embedding_norms`` (between the word
    embeddings and the first block), ``final_norm`` (pre-LN decoders' norm after the last block)
    and the ``head``."""

    blocks: list[BlockRoles]
    embedding_norms: list[NormSite] = field(default_factory=list)
    final_norm: NormSite | None = None
    head: HeadRoles = field(default_factory=HeadRoles)

    def require_plain(self, method: str) -> None:
        """Refuse, in one line, a ``method`` that follows only plain blocks
        (:meth:`BlockRoles.unplain`) on blocks that are not."""
        found = dict.fromkeys(what for block in self.blocks for what in block.unplain())
        if found:
            raise UnsupportedModelError(
                f"{method} follows plain pre-LN and post-LN blocks; this model's blocks have {' and '.join(found)}",
                hint="explain it with a gradient, perturbation, attention or relevance method (docs/extending.md)",
            )

    def lrp(self) -> LRPRoles:
        """The operations relevance propagation attaches its rules to."""
        return LRPRoles(
            blocks=[block.lrp() for block in self.blocks],
            embedding_norms=list(self.embedding_norms),
            head_linears=list(self.head.linears),
            head_norms=([self.final_norm] if self.final_norm is not None else []) + list(self.head.norms),
            head_activations=list(self.head.activations),
        )
