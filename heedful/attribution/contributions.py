"""Token-to-token contributions of each block, rolled out through the layers: ALTI, GlobEnc and
ALTI-Logit.

Each block's attention sub-layer is rewritten as a sum over source tokens: the output of
position ``i`` is ``y_i = sum_j T_i(x_j) + b``, where ``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) +
delta_ij x_i`` is what source ``j`` sends through every head (its value vector, bias included,
through the head's slice of the output projection ``f_h``) plus the residual, and ``b`` the
output projection's bias (post-LN blocks: the whole passed through the norm linearised at the
token's statistics, its bias added). The methods differ in how they turn these vectors into one
matrix per layer and what they read from it (:func:`layer_vectors` is shared; the recording
pass and the linear algebra come from :mod:`heedful.attribution.decomposition`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from heedful.adapters.roles import BlockRoles, ModelRoles
from heedful.attribution.decomposition import (
    BlockRecord,
    Recording,
    affine,
    decompose_head,
    head_columns,
    norm_apply,
    norm_bias,
    norm_linear,
    norm_scale,
    recordings,
    scatter,
    target_parts,
)
from heedful.engine.problem import Problem
from heedful.registry import register

STATES = 4.0
"""``[N, N, D]`` tensors a layer's contributions keep alive at once."""


@dataclass
class LayerVectors:
    """One block's attention sub-layer as a sum over sources: ``vectors`` ``[B, N, N, D]``
    (``[b, i, j]``: what source ``j`` sends to position ``i``, the residual included, post-LN
    blocks through the norm linearised at ``i``'s statistics), ``output`` ``[B, N, D]`` the
    sub-layer's output ``sum_j vectors[:, i, j] + bias`` (post-LN: the norm's output; pre-LN:
    the residual stream after attention), ``transformed`` ``[B, N, H, D]`` each source's
    value vector through each head's slice of the output projection ``f_h(x_j)``."""

    vectors: torch.Tensor
    output: torch.Tensor
    transformed: torch.Tensor


def transformed_values(rec: BlockRecord, block: BlockRoles) -> torch.Tensor:
    """``f_h(x_j) = v_j^h W_O^h`` ``[B, N, H, D]``: each position's value vector (the recorded
    value projection's output, bias included; a key/value head serves its group of query
    heads) through each head's slice of the attention output projection."""
    w_out, _ = affine(block.attn_out, block.transposed)
    heads, kv_heads = block.context.heads, block.value.heads
    bsz, seq, width = rec.value.shape
    d = width // kv_heads
    values = rec.value.reshape(bsz, seq, kv_heads, d).repeat_interleave(heads // kv_heads, dim=2)  # [B, N, H, d]
    return torch.einsum("bjhe,dhe->bjhd", values, w_out.reshape(w_out.shape[0], heads, d))


def layer_vectors(rec: BlockRecord, block: BlockRoles) -> LayerVectors:
    """The block's attention sub-layer as a sum over sources (:class:`LayerVectors`):
    ``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + delta_ij x_i``; post-LN blocks then
    ``gamma * (T - mean(T)) / s_i`` (the norm at ``i``'s statistics), ``y_i = sum_j T + gamma *
    (b_O - mean(b_O)) / s_i + beta``; pre-LN blocks ``y_i = sum_j T + b_O``."""
    transformed = transformed_values(rec, block)
    vectors = torch.einsum("bhij,bjhd->bijd", rec.probs, transformed)
    seq = vectors.shape[1]
    idx = torch.arange(seq, device=vectors.device)
    vectors[:, idx, idx] += rec.block_in
    _, b_out = affine(block.attn_out, block.transposed)
    if block.pre_ln:
        output = vectors.sum(dim=2)
        if b_out is not None:
            output = output + b_out
        return LayerVectors(vectors, output, transformed)
    norm = block.attn_norm
    scale = norm_scale(norm, rec.attn_norm_in)  # [B, N, 1]
    vectors = norm_linear(norm, vectors, scale)
    output = vectors.sum(dim=2)
    if b_out is not None:
        output = output + norm_linear(norm, b_out.expand(*output.shape)[:, :, None, :], scale)[:, :, 0]
    beta = norm_bias(norm)
    return LayerVectors(vectors, output if beta is None else output + beta, transformed)


def row_normalised(matrix: torch.Tensor) -> torch.Tensor:
    """Rows of ``[..., N, N]`` divided by their sums (rows summing to 0, e.g. padding, stay 0)."""
    total = matrix.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, matrix / total.clamp_min(torch.finfo(matrix.dtype).tiny), 0.0)


def alti_matrix(layer: LayerVectors) -> torch.Tensor:
    """ALTI's contributions ``[B, N, N]``: ``c_ij = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``,
    rows normalised to sum to 1 (Ferrando et al. 2022, Eq. 9-10)."""
    y = layer.output[:, :, None, :]
    distance = (y - layer.vectors).abs().sum(dim=-1)
    return row_normalised((y.abs().sum(dim=-1) - distance).clamp_min(0.0))


def globenc_matrix(layer: LayerVectors, rec: BlockRecord, block: BlockRoles) -> torch.Tensor:
    """GlobEnc's ``N_ij`` ``[B, N, N]``: the norm of source ``j``'s vector through the block's
    second norm linearised at ``i``'s statistics (post-LN; the MLP left out), ``||gamma_2 *
    (T' - mean(T')) / s2_i||``; a pre-LN block has no norm at its output and gives ``||T_i(x_j)||``."""
    if block.pre_ln:
        return layer.vectors.norm(dim=-1)
    norm = block.mlp_norm
    return norm_linear(norm, layer.vectors, norm_scale(norm, rec.mlp_norm_in)).norm(dim=-1)


def rolled_rows(matrices: Iterator[torch.Tensor], anchor: torch.Tensor, layerwise: bool, rollout: bool = True) -> torch.Tensor:
    """Rollout as plain products ``M_l ... M_1`` (no identity added), the anchor's row: ``[B, N]``
    after the last layer, or ``[B, L, N]`` after each layer; ``rollout=False``: each layer's own
    matrix ``M_l`` instead of the product (the NormXLogit paper's per-layer "ALTI¬" and "GlobEnc¬")."""
    rows = torch.arange(anchor.shape[0], device=anchor.device)
    joint: torch.Tensor | None = None
    found = []
    for matrix in matrices:
        joint = matrix if joint is None or not rollout else matrix @ joint
        if layerwise:
            found.append(joint[rows, anchor])
    assert joint is not None
    return torch.stack(found, dim=1) if layerwise else joint[rows, anchor]


def _matrices(rec: Recording, roles: ModelRoles, kind: str) -> Iterator[torch.Tensor]:
    for block_rec, block in zip(rec.blocks, roles.blocks, strict=True):
        layer = layer_vectors(block_rec, block)
        yield alti_matrix(layer) if kind == "alti" else globenc_matrix(layer, block_rec, block)


def _rollout_scores(problem: Problem, kind: str, layerwise: bool, rollout: bool) -> torch.Tensor:
    roles = problem.adapter.roles()
    layers = problem.adapter.num_layers if layerwise else None

    def groups() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for rec in recordings(problem, kind, STATES):
            yield rec.rows, rolled_rows(_matrices(rec, roles, kind), rec.anchor, layerwise, rollout)

    return scatter(problem, groups(), layers)


CONTRIBUTION_COST = "2 forwards + O(L N^2 H D) contributions; O(N^2 D) memory per layer (examples grouped under max_memory)"
"""The prediction's pass, one that records every block, and the per-layer contributions."""


@register("alti", family="vector", cost=CONTRIBUTION_COST, needs=("roles", "plain_blocks"))
@torch.no_grad()
def alti(problem: Problem, *, rollout: bool = True, layerwise: bool = False) -> torch.Tensor:
    """Aggregation of Layer-wise Token-to-token Interactions: L1-distance contributions, rolled out.

    Per block, each source's vector ``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + delta_ij x_i`` (post-LN
    blocks: through the norm linearised at ``i``'s statistics) against the sub-layer's output
    ``y_i = sum_j T_i(x_j) + b``: ``c_ij = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``, rows
    normalised (Eq. 9-10); the matrices rolled out as plain products ``C_L ... C_1`` (no identity:
    the residual is inside ``T``), the anchor's row ``[B, N]``; ``layerwise=True``: the rollout
    after each layer ``[B, L, N]``; ``rollout=False``: each layer's own matrix instead of the
    product ("ALTI¬", the per-layer scores the NormXLogit paper compares). Task-independent (the
    target does not enter).

    Families: every block the roles describe (BERT-style post-LN encoders, DistilBERT, DeBERTa-v2 --
    relative attention only changes the probabilities --, GPT-2, OPT, the Llama family); in a
    pre-LN block the first norm sits inside ``f_h`` (the value vectors) and ``y_i`` is the
    residual stream after attention.

    Source: Ferrando et al. 2022, Measuring the Mixing of Contextual Information in the
    Transformer (EMNLP); reference mt-upc/transformer-contributions (src/contributions.py)
    """
    return _rollout_scores(problem, "alti", layerwise, rollout)


@register("globenc", family="vector", cost=CONTRIBUTION_COST, needs=("roles", "plain_blocks"))
@torch.no_grad()
def globenc(problem: Problem, *, rollout: bool = True, layerwise: bool = False) -> torch.Tensor:
    """Norm of each token's vector through attention, residual and both layer norms, rolled out.

    Per block ``N_ij = ||LN2lin(LN1lin(sum_h A_h[i, j] f_h(x_j) + delta_ij x_i))||_2``, each norm
    linearised at position ``i``'s own statistics (``gamma * (x - mean(x)) / s_i``, biases left
    out) and the MLP left out (Modarressi et al. 2022, Eq. 5-7, "N-Enc"); the matrices rolled out
    as plain products ``N_L ... N_1`` without normalising their rows -- as the reference code does
    (its rollout takes the norms as they are; a row-normalised variant differs) -- the anchor's
    row ``[B, N]``; ``layerwise=True``: after each layer ``[B, L, N]``; ``rollout=False``: each
    layer's own matrix instead of the product ("GlobEnc¬"). Task-independent.

    Families: every block the roles describe; a pre-LN block (GPT-2, OPT, the Llama family) has
    no norm at its output, so its ``N_ij`` is ``||T_i(x_j)||`` with the first norm inside the value
    vectors (the paper covers post-LN encoders only).

    Source: Modarressi et al. 2022, GlobEnc: Quantifying Global Token Attribution by
    Incorporating the Whole Encoder Layer in Transformers (NAACL); reference mohsenfayyaz/GlobEnc
    (src/modeling/modeling_bert.py)
    """
    return _rollout_scores(problem, "globenc", layerwise, rollout)


def _final_real(rec: Recording, roles: ModelRoles) -> torch.Tensor:
    """The representation the head reads at each anchor ``[B, D]`` (after the final norm)."""
    rows = torch.arange(rec.size, device=rec.anchor.device)
    last = rec.blocks[-1].block_out[rows, rec.anchor]
    if roles.final_norm is None:
        return last
    return norm_apply(roles.final_norm, rec.final_in[rows, rec.anchor])


def _logit_lens(problem: Problem, rec: Recording, roles: ModelRoles, vectors: torch.Tensor) -> torch.Tensor:
    """The target's logit read off ``vectors`` ``[B, K, D]`` of the residual stream at the anchor:
    the final norm linearised at the final representation's statistics, the head chain without
    its biases (elementwise activations by their zero-origin slope) -> ``[B, K]``."""
    rows = torch.arange(rec.size, device=rec.anchor.device)
    real = _final_real(rec, roles)
    final = roles.final_norm
    if final is not None:
        vectors = norm_linear(final, vectors, norm_scale(final, rec.final_in[rows, rec.anchor]))
    head = decompose_head(
        roles.head.steps, vectors, real, head_columns(problem, rec.rows), "absdot", aside=False, biases=False
    )
    return target_parts(problem, rec.rows, head)


def logit_contributions(problem: Problem, rec: Recording, roles: ModelRoles, rollout: bool) -> torch.Tensor:
    """ALTI-Logit per layer ``[B, L, N]``: each block's attention update of the target logit per
    source at its input (:func:`attention_logits`), carried to the input tokens by ALTI's rollout
    of the blocks before it (``rollout``; otherwise the block's inputs are taken as the tokens)."""
    joint: torch.Tensor | None = None
    found = []
    for block_rec, block in zip(rec.blocks, roles.blocks, strict=True):
        layer = layer_vectors(block_rec, block)
        update = attention_logits(problem, rec, roles, block_rec, layer)  # [B, N]
        if rollout and joint is not None:
            update = (update[:, None, :] @ joint)[:, 0]
        found.append(update)
        if rollout:
            matrix = alti_matrix(layer)
            joint = matrix if joint is None else matrix @ joint
    return torch.stack(found, dim=1)


def attention_logits(
    problem: Problem, rec: Recording, roles: ModelRoles, block_rec: BlockRecord, layer: LayerVectors
) -> torch.Tensor:
    """One block's attention update of the target logit per source at the block's input
    ``[B, N]``: ``Delta_j = U . LNf(sum_h A_h[a, j] f_h(x_j))`` at the anchor ``a`` (the affine
    part of each source's vector: value biases included, the output projection's bias and the
    residual left out), read by :func:`_logit_lens`."""
    rows = torch.arange(rec.size, device=rec.anchor.device)
    at_anchor = block_rec.probs[rows, :, rec.anchor]  # [B, H, N]
    vectors = torch.einsum("bhj,bjhd->bjd", at_anchor, layer.transformed)
    return _logit_lens(problem, rec, roles, vectors)


@register("alti_logit", family="vector", cost=CONTRIBUTION_COST, quantities=("logit",), needs=("roles", "head", "plain_blocks", "pre_ln_blocks"))
@torch.no_grad()
def alti_logit(problem: Problem, *, rollout: bool = True, layerwise: bool = False) -> torch.Tensor:
    """Each token's part of the target logit through every attention update, tracked by ALTI.

    A pre-LN model's residual stream is a sum of updates, so the logit is too (the final norm
    linearised at the final representation's statistics, the head's linear maps -- logit lens).
    Block ``l``'s attention update at the anchor ``a`` splits over its input positions:
    ``Delta^l_j = U_target . LNf(sum_h A^l_h[a, j] f^l_h(x^l_j))`` (value biases included, Eq. 6-8);
    ALTI's rollout of the blocks before it carries it to the input tokens,
    ``Delta^l M^{l-1}`` with ``M^{l-1} = C^{l-1} ... C^1`` (:func:`alti_matrix`; ``rollout=False``:
    the block's inputs taken as the tokens, the paper's "Logit"); summed over layers ``[B, N]``,
    or per layer ``[B, L, N]`` with ``layerwise=True``. A contrast explains the logit difference.
    The MLPs' updates and the biases of the output projections belong to no token and are left
    out, as in the reference.

    Families: pre-LN models (GPT-2, OPT with pre-LN blocks, the Llama family; RMSNorm is
    linearised at its scale). Post-LN encoders are refused: their residual stream is renormalised
    after every sub-layer, so layer updates do not add up to the logit -- use ``decompx`` there.

    Source: Ferrando et al. 2023, Explaining How Transformers Use Context to Build Predictions
    (ACL); reference mt-upc/logit-explanations (src/contributions.py, extract_explanations.py)
    """
    adapter = problem.adapter
    roles = adapter.roles()
    layers = adapter.num_layers if layerwise else None

    def groups() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for rec in recordings(problem, "alti_logit", STATES):
            per_layer = logit_contributions(problem, rec, roles, rollout)
            yield rec.rows, per_layer if layerwise else per_layer.sum(dim=1)

    return scatter(problem, groups(), layers)
