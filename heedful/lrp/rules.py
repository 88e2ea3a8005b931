"""Rule sets: how relevance passes each kind of operation, attached by role.

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
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, ClassVar

import torch

from heedful.adapters.lrp_roles import LinearSite, LRPRoles
from heedful.lrp.functions import (
    EPS,
    DualRule,
    IdentityRule,
    NormIdentity,
    ResidualSplit,
    ScaleGrad,
    SegmentEnd,
    SegmentStart,
    safe_divide,
)

if TYPE_CHECKING:
    from heedful.lrp.session import LRPSession


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


def add_z(rel: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain z-rule on ``a + b``: ``R_a = a R / (a + b)``, ``R_b = b R / (a + b)``."""
    s = safe_divide(rel, a + b)
    return a * s, b * s


def add_renormalised(rel: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chefer Eq. 7-8: z-rule shares, then each rescaled so that, per example,
    ``sum R_a = |sum R_a| / (|sum R_a| + |sum R_b|) * sum R`` (and likewise for ``b``).

    The reference sums over the whole batch; here every sum is per example.
    """
    ra, rb = add_z(rel, a, b)
    dims = tuple(range(1, rel.dim()))
    sa, sb, total = ra.sum(dims, keepdim=True), rb.sum(dims, keepdim=True), rel.sum(dims, keepdim=True)
    share = sa.abs() + sb.abs()
    fa = safe_divide(sa.abs(), share) * total
    fb = safe_divide(sb.abs(), share) * total
    return ra * safe_divide(fa, sa), rb * safe_divide(fb, sb)


def repeat_kv(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: repeat ``[B, Hkv, M, d]`` keys / values to ``heads`` heads."""
    groups = heads // key.shape[1]
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def _softmax(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------- rule sets
class RuleSet:
    """How one family of LRP rules attaches to a model and runs its attention."""

    name: ClassVar[str] = "rules"
    relevance_form: ClassVar[bool] = True
    """True: the backward quantity is relevance and input relevance is read at the first block's
    input; False: gradient x input at the word embeddings."""

    def attach(self, session: LRPSession, roles: LRPRoles) -> None:
        raise NotImplementedError

    def attention(
        self,
        session: LRPSession,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``softmax(Q K^T * scaling + mask) V`` with the rules' backward.
        ``query`` ``[B, H, N, d]``, ``key``/``value`` ``[B, Hkv, M, d]`` -> output
        ``[B, N, H, d]`` and probabilities ``[B, H, N, M]``."""
        raise NotImplementedError

    def project(self, session: LRPSession, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Per-row linear map ``[M, E] x [M, K, E] -> [M, K]`` (language-model head columns)."""
        out = torch.einsum("me,mke->mk", x, weight)
        return out if bias is None else out + bias


class CheferRules(RuleSet):
    """Chefer et al. 2021a relevance rules (``add="renormalised"``) or the original LRP rules of
    their baselines (``add="z"``). See the module docstring."""

    relevance_form = True

    def __init__(self, add: str = "renormalised") -> None:
        if add not in ("renormalised", "z"):
            raise ValueError(f"add must be 'renormalised' or 'z', got {add!r}")
        self.add = add_renormalised if add == "renormalised" else add_z
        self.name = "chefer" if add == "renormalised" else "lrp"

    def attach(self, session: LRPSession, roles: LRPRoles) -> None:
        for site in roles.linears():
            session.on_output(site.module, partial(self._linear, session, site))
        for norm in roles.norms():
            session.on_output(norm.module, partial(self._identity, session))
        for act in roles.activations():
            session.on_output(act, partial(self._identity, session))
        for block in roles.blocks:
            for module in block.rotary:
                session.on_output(module, lambda x, y: SegmentStart.apply(session, y))
            for site in block.residuals:
                key = ("residual", id(site))
                session.capture_input(site.source, key)
                session.on_output(site.branch, partial(self._residual, session, key))
            for site in block.products:
                keys = (("gate", id(site)), ("up", id(site)))
                session.capture_output(site.gate, keys[0])
                session.capture_output(site.up, keys[1])
                session.on_input(site.consumer, partial(self._product, session, keys))

    def _linear(self, session: LRPSession, site: LinearSite, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        bias = getattr(site.module, "bias", None)
        return DualRule.apply(session, partial(linear_alpha1_beta0, weight=site.weight(), bias=bias), y, x, y)

    @staticmethod
    def _identity(session: LRPSession, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return DualRule.apply(session, identity, y, x)

    def _residual(self, session: LRPSession, key: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ResidualSplit.apply(session, self.add, y, session.stashed(key))

    @staticmethod
    def _product(session: LRPSession, keys: tuple, p: torch.Tensor) -> torch.Tensor:
        return DualRule.apply(session, product_halves, p, session.stashed(keys[0]), session.stashed(keys[1]))

    def attention(self, session, layer, query, key, value, mask, scaling):
        if session.rotary[layer]:
            query = SegmentEnd.apply(session, query)
            key = SegmentEnd.apply(session, key)
        key, value = repeat_kv(key, value, query.shape[1])
        key_t = key.transpose(-1, -2)
        scores = DualRule.apply(session, matmul_halves, (query @ key_t) * scaling, query, key_t)
        if mask is not None:
            scores = scores + mask
        probs = DualRule.apply(session, identity, _softmax(scores, query.dtype), scores)
        out = DualRule.apply(session, partial(self._context, session, layer), probs @ value, probs, value)
        session.record_probs(layer, probs)
        return out.transpose(1, 2).contiguous(), probs

    @staticmethod
    def _context(session: LRPSession, layer: int, rel: torch.Tensor, probs: torch.Tensor, value: torch.Tensor):
        """Relevance through ``A V``; Mask-LRP's head mask multiplies ``R`` first (masked heads
        send nothing to ``A``, ``Q``, ``K``, ``V``). Records the map the rollout uses."""
        head_mask = session.head_mask_for(layer)
        kept = rel if head_mask is None else rel * head_mask.view(1, -1, 1, 1).to(rel)
        rel_probs, rel_value = matmul_halves(kept, probs, value)
        if session.keep_maps:
            if head_mask is None:
                session.record_map(layer, rel_probs)
            else:
                full = probs * (safe_divide(rel, probs @ value) @ value.transpose(-1, -2))
                session.record_map(layer, full if session.reference_scale else full / 2)
        return rel_probs, rel_value

    def project(self, session, x, weight, bias):
        out = torch.einsum("me,mke->mk", x, weight)
        if bias is not None:
            out = out + bias
        return DualRule.apply(session, partial(projection_alpha1_beta0, weight=weight), out, x)


class AttnLRPRules(RuleSet):
    """AttnLRP (Achtibat et al. 2024) in gradient x input form; see the module docstring."""

    name = "attnlrp"
    relevance_form = False

    def attach(self, session: LRPSession, roles: LRPRoles) -> None:
        for norm in roles.norms(embeddings=True):
            weight = getattr(norm.module, "weight", None)
            session.on_output(
                norm.module, partial(_norm_identity, kind=norm.kind, eps=norm.eps, weight=weight)
            )
        for act in roles.activations():
            session.on_output(act, IdentityRule.apply)
        for block in roles.blocks:
            for site in block.products:
                session.on_input(site.consumer, lambda p: ScaleGrad.apply(p, 0.5))

    def attention(self, session, layer, query, key, value, mask, scaling):
        query = ScaleGrad.apply(query, 0.25)
        key = ScaleGrad.apply(key, 0.25)
        value = ScaleGrad.apply(value, 0.5)
        key, value = repeat_kv(key, value, query.shape[1])
        scores = (query @ key.transpose(-1, -2)) * scaling
        if mask is not None:
            scores = scores + mask
        probs = _softmax(scores, query.dtype)
        session.record_probs(layer, probs)
        return (probs @ value).transpose(1, 2).contiguous(), probs


def _norm_identity(x: torch.Tensor, y: torch.Tensor, *, kind: str, eps: float, weight) -> torch.Tensor:
    return NormIdentity.apply(x, y, kind, eps, weight)


RULE_SETS = {"chefer": lambda: CheferRules("renormalised"), "lrp": lambda: CheferRules("z"), "attnlrp": AttnLRPRules}


def rule_set(name: str) -> RuleSet:
    """A fresh rule set by name: ``chefer``, ``lrp`` (original LRP) or ``attnlrp``."""
    if name not in RULE_SETS:
        from heedful.errors import InputError

        raise InputError(f"unknown LRP rule set {name!r}", hint="use one of: " + ", ".join(RULE_SETS))
    return RULE_SETS[name]()
