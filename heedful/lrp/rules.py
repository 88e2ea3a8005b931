"""Rule sets: how relevance passes each kind of operation, attached by role.

A rule set attaches its autograd functions (:mod:`heedful.lrp.functions`) to the operations
relevance propagation needs (:class:`~heedful.adapters.roles.LRPRoles`) through an
:class:`~heedful.adapters.intercept.Interception`, and swaps each block's attention computation
for its own; during the backward passes its rules read a :class:`RelevanceState`.

:class:`CheferRules` -- Chefer, Gur & Wolf 2021a, "Transformer Interpretability Beyond Attention
Visualization" (CVPR), Sec. 3.1-3.2 and their ``layers_ours.py``: alpha=1, beta=0 on every
linear map (Eq. 4 with positive-only contributions, bias ignored), the z-rule on both operands
of the attention products ``Q K^T`` and ``A V`` with each half kept (Eq. 5-6 applied to a
product, then halved), the renormalised residual addition (Eq. 7-8: each operand's share
rescaled so their sums split ``sum R`` in proportion to ``|sum R_a|`` and ``|sum R_b|``), and
the identity for softmax, GELU/SiLU/tanh, LayerNorm/RMSNorm and dropout. ``add="z"`` gives the
"original" LRP of their baselines (``layers_lrp.py``): the plain z-rule on additions.
Gated products (Llama MLPs) get the product rule with halves, rotary position embeddings the
z-rule (they are linear and bias-free).

:class:`AttnLRPRules` -- Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance
Propagation for Transformers" (ICML), in the gradient x input form of their ``lxt.efficient``:
epsilon rule on linear maps (the ordinary gradient), the uniform rule on bilinear products
(Eq. 7: gradient halved for each operand of ``A V`` and ``Q K^T``, so ``Q``, ``K`` get 1/4 and
``V`` 1/2; a gated product's operands 1/2), the softmax rule (Eq. 13, which the ordinary
gradient x input of a softmax already is), the identity rule on element-wise activations
(Eq. 9) and on the normalising division of LayerNorm/RMSNorm. One modified backward pass.

Conservation: with Chefer's rules a block conserves relevance up to the ``1e-9`` stabiliser
and outputs whose positive pre-activations vanish; with AttnLRP biases, LayerNorm shifts and
the softmax rule's bias term absorb part of it (see the tests for measured tolerances).

Processor dependence: Chefer's z-rule shares divide by sums of signed terms (``a + b`` of an
addition, the operands' products), which can all but cancel, and the ``1e-9`` stabiliser (the
reference's) does not damp them, so float32 rounding decides some shares. The token orders of
``lrp``, ``chefer`` and ``mask_lrp`` therefore move with the processor's kernels, while
AttnLRP's and every gradient method's do not (``benchmarks/processor_stability.py``, AVX-512
against AVX2 kernels; ``benchmarks/results/processor-stability.md``): a published number of
theirs is the processor's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar, Literal

import torch

from heedful.adapters.intercept import (
    AttentionCall,
    Interception,
    Kept,
    attention_softmax,
    eager_attention,
    repeat_kv,
    softcapped,
)
from heedful.adapters.roles import LinearSite, LRPRoles, Site
from heedful.errors import UnsupportedModelError
from heedful.lrp.functions import (
    EPS,
    GRADIENT,
    DualRule,
    IdentityRule,
    NormIdentity,
    ResidualSplit,
    ScaleGrad,
    SegmentEnd,
    SegmentStart,
    safe_divide,
)

MaskVariant = Literal["literal", "reference"]
"""How Mask-LRP's head mask acts in the relevance pass (see :meth:`CheferRules._context`)."""
MASK_VARIANTS: tuple[str, ...] = MaskVariant.__args__


@dataclass
class RelevanceState:
    """What the rules read and write while gradients and relevance flow backward (set after the
    forward): ``mode`` -- what relevance-form rules send backward, ``"gradient"`` (the true
    gradient) or ``"relevance"``; ``head_mask`` ``[L, H]`` (0/1), which multiplies the relevance of
    each head's output in the relevance pass (Mask-LRP); ``mask_variant`` -- ``"literal"``: the kept
    heads' relevance is renormalised so that the attention branch passes on what all heads
    received (Song et al. 2024 Eq. 9-10), and a block whose every head is cut sends its whole
    relevance down the residual; ``"reference"``: no renormalisation (the Mask-LRP code);
    ``reference_scale`` (the reference variant only: keep its unhalved map of the unmasked relevance);
    ``keep_maps`` (record the relevance of the attention probabilities, ``[B, H, N, M]`` per layer,
    in ``maps``)."""

    mode: str = GRADIENT
    head_mask: torch.Tensor | None = None
    mask_variant: str = "literal"
    reference_scale: bool = True
    keep_maps: bool = False
    maps: dict[int, torch.Tensor] = field(default_factory=dict)

    def head_mask_for(self, layer: int) -> torch.Tensor | None:
        return None if self.head_mask is None else self.head_mask[layer]

    def cuts_every_head(self, layer: int) -> bool:
        """The literal variant's head mask keeps no head of ``layer``."""
        mask = self.head_mask_for(layer)
        return mask is not None and self.mask_variant == "literal" and not bool(mask.any())

    def record_map(self, layer: int, relevance: torch.Tensor) -> None:
        self.maps[layer] = relevance.detach()


# ---------------------------------------------------------------------- relevance rules
ZERO_SHARE = 1e-5
"""Relative size below which an alpha1-beta0 denominator counts as 0 (float cancellation)."""


def linear_alpha1_beta0(
    rel: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, None]:
    """Chefer Eq. 4 with alpha=1, beta=0: ``Z = W+ x+ + W- x-`` (bias ignored),
    ``R_x = x+ (W+^T R/Z) + x- (W-^T R/Z)``. ``x`` ``[..., in]``, ``y = x W^T + b`` the module's
    output, ``weight`` ``[out, in]``.

    Computed with normal-width products only: ``Z = (W x + |W| |x|) / 2`` (``W x = y - b`` comes
    from the forward) and ``R_x = (x * W^T S + |x| * |W|^T S) / 2`` with ``S = R / Z`` -- three
    products of the layer's size instead of four of twice its width. ``Z >= 0``, and where it is 0
    every contribution is 0, so no sign-aware stabiliser is needed; outputs whose ``Z`` is below
    ``ZERO_SHARE`` of ``|W| |x|`` pass no relevance (as Chefer's ``safe_divide`` does at ``Z = 0``).
    """
    weight = weight.to(x.dtype)
    absolute = weight.abs()
    wx = y if bias is None else y - bias
    magnitude = x.abs() @ absolute.T
    z = (wx + magnitude) / 2
    # Z = 0 exactly when every contribution is 0 (Chefer's safe division then drops R); in floats
    # the difference above leaves ~1e-7 * magnitude there, so smaller Z counts as 0.
    s = torch.where(z > ZERO_SHARE * magnitude, rel / (z + EPS), torch.zeros_like(rel))
    return (x * (s @ weight) + x.abs() * (s @ absolute)) / 2, None


def projection_alpha1_beta0(rel: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor]:
    """:func:`linear_alpha1_beta0` for per-row weights: ``x`` ``[M, E]``, ``weight`` ``[M, K, E]``, ``rel`` ``[M, K]``."""
    weight = weight.to(x.dtype)
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    z = torch.einsum("me,mke->mk", xp, wp) + torch.einsum("me,mke->mk", xn, wn)
    s = safe_divide(rel, z)
    return (xp * torch.einsum("mk,mke->me", s, wp) + xn * torch.einsum("mk,mke->me", s, wn),)


def identity(rel: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    """Relevance passes unchanged (softmax, activations, norms in Chefer's rules)."""
    return (rel,)


def matmul_halves(rel: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z-rule on both operands of ``Z = a @ b`` (each receives all of ``R``), then halved:
    ``R_a = a * (S b^T) / 2``, ``R_b = b * (a^T S) / 2`` with ``S = R / Z``."""
    s = safe_divide(rel, a @ b)
    return a * (s @ b.transpose(-1, -2)) / 2, b * (a.transpose(-1, -2) @ s) / 2


def product_halves(rel: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z-rule on an element-wise product ``a * b`` (each operand's share is all of ``R``), halved."""
    half = torch.where(a * b == 0, torch.zeros_like(rel), rel / 2)
    return half, half


def add_z(rel: torch.Tensor, *terms: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Plain z-rule on a sum ``a + b (+ ...)``: ``R_a = a R / (a + b + ...)``, and so on."""
    s = safe_divide(rel, sum(terms))
    return tuple(t * s for t in terms)


def add_renormalised(rel: torch.Tensor, *terms: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Chefer Eq. 7-8: z-rule shares, then each rescaled so that, per example,
    ``sum R_a = |sum R_a| / (|sum R_a| + |sum R_b| + ...) * sum R`` (and likewise for every term;
    two terms in the paper, three in a parallel block).

    The reference sums over the whole batch; here every sum is per example.
    """
    shares = add_z(rel, *terms)
    dims = tuple(range(1, rel.dim()))
    sums = [r.sum(dims, keepdim=True) for r in shares]
    total, spread_ = rel.sum(dims, keepdim=True), sum(s.abs() for s in sums)
    return tuple(r * safe_divide(safe_divide(s.abs(), spread_) * total, s) for r, s in zip(shares, sums, strict=True))


# ---------------------------------------------------------------------- rule sets
class RuleSet:
    """How one family of LRP rules attaches to a model (by role, through an
    :class:`~heedful.adapters.intercept.Interception`) and runs its attention."""

    name: ClassVar[str] = "rules"
    relevance_form: ClassVar[bool] = True
    """True: the backward quantity is relevance and input relevance is read at the first block's
    input; False: gradient x input at the word embeddings."""

    def attach(self, hooks: Interception, state: RelevanceState, roles: LRPRoles) -> None:
        """Every block's attention computation becomes :meth:`attention`; then :meth:`attach_rules`."""
        for block in roles.blocks:
            hooks.attend_at(block.attention, partial(self.attention, state, bool(block.rotary)))
        self.attach_rules(hooks, state, roles)

    def attach_rules(self, hooks: Interception, state: RelevanceState, roles: LRPRoles) -> None:
        raise NotImplementedError

    def attention(self, state: RelevanceState, rotary: bool, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor]:
        """``softmax(Q K^T * scaling + mask) V`` with the rules' backward (``rotary``: query and
        key were rotated after their projections). ``call.query`` ``[B, H, N, d]``,
        ``call.key`` / ``call.value`` ``[B, Hkv, M, d]`` -> output ``[B, N, H, d]`` and
        probabilities ``[B, H, N, M]``."""
        raise NotImplementedError

    def project(self, state: RelevanceState, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Per-row linear map ``[M, E] x [M, K, E] -> [M, K]`` (language-model head columns)."""
        out = torch.einsum("me,mke->mk", x, weight)
        return out if bias is None else out + bias

    def cap(self, state: RelevanceState, z: torch.Tensor, softcap: float) -> torch.Tensor:
        """Soft-capped logits ``tanh(z / c) * c`` under the identity rule (an element-wise
        non-linearity, AttnLRP Eq. 9; Chefer et al.'s rules pass relevance through them too)."""
        return IdentityRule.apply(z, softcapped(z, softcap))


class CheferRules(RuleSet):
    """Chefer et al. 2021a relevance rules (``add="renormalised"``) or the original LRP rules of
    their baselines (``add="z"``). See the module docstring."""

    relevance_form = True

    def __init__(self, add: str = "renormalised") -> None:
        if add not in ("renormalised", "z"):
            raise ValueError(f"add must be 'renormalised' or 'z', got {add!r}")
        self.add = add_renormalised if add == "renormalised" else add_z
        self.name = "chefer" if add == "renormalised" else "lrp"

    def attach_rules(self, hooks: Interception, state: RelevanceState, roles: LRPRoles) -> None:
        if any(block.experts for block in roles.blocks):
            raise UnsupportedModelError(
                f"the {self.name} rules do not follow a mixture of experts (the routing weights are no linear map)",
                hint="use attnlrp, which follows the experts the router chose",
            )
        for site in roles.linears():
            hooks.at(site.output, partial(self._linear, state, site))
        for norm in roles.norms():
            hooks.at(norm.output, partial(_identity_rule, state))
        for act in roles.activations():
            hooks.at(Site(act), partial(_identity_rule, state))
        for layer, block in enumerate(roles.blocks):
            for site in block.rotary:
                hooks.at(site, partial(_segment_start, state))
            for site in block.residuals:
                residual = hooks.keep(Site(site.source, "input"))
                others = [hooks.keep(Site(module)) for module in site.also]
                hooks.at(Site(site.branch), partial(self._residual, state, residual, others, layer, site.attention))
            for site in block.products:
                gate, up = hooks.keep(Site(site.gate)), hooks.keep(site.up)
                hooks.at(Site(site.consumer, "input"), partial(_product, state, gate, up))

    @staticmethod
    def _linear(state: RelevanceState, site: LinearSite, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        bias = getattr(site.module, "bias", None)
        return DualRule.apply(state, partial(linear_alpha1_beta0, weight=site.weight(), bias=bias), y, x, y)

    def cap(self, state: RelevanceState, z: torch.Tensor, softcap: float) -> torch.Tensor:
        return DualRule.apply(state, identity, softcapped(z, softcap), z)

    def _residual(
        self, state: RelevanceState, residual: Kept, others: list[Kept], layer: int, attention: int | None, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        rule = self.add if attention is None else partial(_attention_split, state, layer, attention, self.add)
        return ResidualSplit.apply(state, rule, y, *(k.value for k in others), residual.value)

    def attention(self, state, rotary, call):
        query, key = call.query, call.key
        if rotary:
            query = SegmentEnd.apply(state, query)
            key = SegmentEnd.apply(state, key)
        key, value = repeat_kv(key, call.value, query.shape[1])
        key_t = key.transpose(-1, -2)
        scores = DualRule.apply(state, matmul_halves, (query @ key_t) * call.scaling, query, key_t)
        if call.softcap is not None:  # an element-wise non-linearity: the identity rule
            scores = DualRule.apply(state, identity, softcapped(scores, call.softcap), scores)
        if call.mask is not None:
            scores = scores + call.mask
        probs = DualRule.apply(state, identity, attention_softmax(scores, query.dtype), scores)
        out = DualRule.apply(state, partial(self._context, state, call.layer), probs @ value, probs, value)
        return out.transpose(1, 2).contiguous(), probs

    @staticmethod
    def _context(state: RelevanceState, layer: int, rel: torch.Tensor, probs: torch.Tensor, value: torch.Tensor):
        """Relevance through ``A V`` (``rel`` ``[B, H, N, d]``, ``probs`` ``[B, H, N, M]``, ``value``
        ``[B, H, M, d]``); records the map of ``A`` the rollout uses.

        Mask-LRP's head mask ``m`` multiplies ``R`` first (cut heads send nothing to ``A``, ``Q``,
        ``K``, ``V``). ``"literal"`` (Song et al. 2024 Sec. 4.3): ``(R_A, R_V) = G(A, V, m R)`` is
        then rescaled per example by ``sum R / sum (R_A + R_V)``, so that the kept heads carry on
        what all heads received (the normalisation after Eq. 9, with ``R_synt + R_pos`` the kept
        heads' relevance); the map recorded is that renormalised ``R_A``. ``"reference"``: no
        rescaling, and the map recorded is ``R_A`` of the *unmasked* ``R`` (unhalved with
        ``reference_scale``), as Mask-LRP's code saves it."""
        head_mask = state.head_mask_for(layer)
        kept = rel if head_mask is None else rel * head_mask.view(1, -1, 1, 1).to(rel)
        rel_probs, rel_value = matmul_halves(kept, probs, value)
        literal = head_mask is not None and state.mask_variant == "literal"
        if literal:
            dims = tuple(range(1, rel.dim()))
            passed = rel_probs.sum(dims, keepdim=True) + rel_value.sum(dims, keepdim=True)
            factor = safe_divide(rel.sum(dims, keepdim=True), passed)
            rel_probs, rel_value = rel_probs * factor, rel_value * factor
        if state.keep_maps:
            if head_mask is None or literal:
                state.record_map(layer, rel_probs)
            else:
                full = probs * (safe_divide(rel, probs @ value) @ value.transpose(-1, -2))
                state.record_map(layer, full if state.reference_scale else full / 2)
        return rel_probs, rel_value

    def project(self, state, x, weight, bias):
        out = torch.einsum("me,mke->mk", x, weight)
        if bias is not None:
            out = out + bias
        return DualRule.apply(state, partial(projection_alpha1_beta0, weight=weight), out, x)


class AttnLRPRules(RuleSet):
    """AttnLRP (Achtibat et al. 2024) in gradient x input form; see the module docstring."""

    name = "attnlrp"
    relevance_form = False

    def attach_rules(self, hooks: Interception, state: RelevanceState, roles: LRPRoles) -> None:
        for norm in roles.norms(embeddings=True):
            hooks.at(norm.output, partial(_norm_identity, kind=norm.kind, eps=norm.eps, weight=norm.gain()))
        for act in roles.activations():
            hooks.at(Site(act), IdentityRule.apply)
        for block in roles.blocks:
            for site in block.products:
                hooks.at(Site(site.consumer, "input"), _half_gradient)
            for experts in block.experts:
                # the uniform rule (Eq. 7) on each w_k * E_k(x) halves both operands' gradient; on
                # each expert's gated product act(gate(x)) * up(x) it halves it again for x
                hooks.at(Site(experts.module), _half_gradient)
                hooks.at(Site(experts.module, "input"), _half_gradient)

    def attention(self, state, rotary, call):
        scaled = replace(
            call,
            query=ScaleGrad.apply(call.query, 0.25),
            key=ScaleGrad.apply(call.key, 0.25),
            value=ScaleGrad.apply(call.value, 0.5),
        )
        if call.softcap is None:
            return eager_attention(scaled)
        # soft-capping is an element-wise non-linearity: the identity rule (Eq. 9) on it
        key, value = repeat_kv(scaled.key, scaled.value, scaled.query.shape[1])
        raw = (scaled.query @ key.transpose(-1, -2)) * call.scaling
        scores = IdentityRule.apply(raw, softcapped(raw, call.softcap))
        if call.mask is not None:
            scores = scores + call.mask
        probs = attention_softmax(scores, raw.dtype)
        return (probs @ value).transpose(1, 2).contiguous(), probs


def _attention_split(state: RelevanceState, layer: int, attention: int, add, rel: torch.Tensor, *terms: torch.Tensor):
    """The residual addition with the attention sub-layer's term ``terms[attention]``: ``add``'s
    split, except that a block whose every head the literal Mask-LRP variant cuts splits ``R``
    among the other terms only (its attention branch could pass nothing on; Eq. 3 conservation):
    all of it to the residual in a sequential block."""
    if not state.cuts_every_head(layer):
        return add(rel, *terms)
    rest = list(terms[:attention] + terms[attention + 1 :])
    shares = list(add(rel, *rest)) if len(rest) > 1 else [rel]
    return (*shares[:attention], torch.zeros_like(rel), *shares[attention:])


def _identity_rule(state: RelevanceState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return DualRule.apply(state, identity, y, x)


def _segment_start(state: RelevanceState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return SegmentStart.apply(state, y)


def _product(state: RelevanceState, gate: Kept, up: Kept, x: None, p: torch.Tensor) -> torch.Tensor:
    return DualRule.apply(state, product_halves, p, gate.value, up.value)


def _half_gradient(x: None, p: torch.Tensor) -> torch.Tensor:
    return ScaleGrad.apply(p, 0.5)


def _norm_identity(x: torch.Tensor, y: torch.Tensor, *, kind: str, eps: float, weight) -> torch.Tensor:
    return NormIdentity.apply(x, y, kind, eps, weight)


RULE_SETS = {"chefer": lambda: CheferRules("renormalised"), "lrp": lambda: CheferRules("z"), "attnlrp": AttnLRPRules}


def rule_set(name: str) -> RuleSet:
    """A fresh rule set by name: ``chefer``, ``lrp`` (original LRP) or ``attnlrp``."""
    if name not in RULE_SETS:
        from heedful.errors import InputError

        raise InputError(f"unknown LRP rule set {name!r}", hint="use one of: " + ", ".join(RULE_SETS))
    return RULE_SETS[name]()
