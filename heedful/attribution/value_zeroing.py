"""Value Zeroing (Mohebbi et al. 2023): how much each block's output for one token changes when
another token's value vectors are zeroed, rolled out through the layers.

For block ``l`` and token ``j``, the block is run again on its original input with the value
vectors of ``j`` zeroed in every head; ``S^l[i, j]`` is the cosine distance between the new and
the original output of token ``i``. Every ``(l, j)`` is one single-block pass; heedful runs them
as ``N`` copies of each example through the batched runner (:mod:`heedful.engine.runner`), copy ``j``
zeroing token ``j``'s values in *every* block while each block's input is reset to the original
one -- so one pass of a copy gives block ``l``'s zeroed output for every ``l`` at once, the
``L x N`` single-block passes of the reference in ``N`` forwards.

Where the roles describe the block after its attention (its norms and MLP), the copies are not
run at all: zeroing token ``j``'s values leaves the attention probabilities as they are, so the
attention output at ``i`` loses exactly ``T'_ij = sum_h A_h[i, j] v_j^h W_O^h`` (ALTI's vectors
without the residual), and only the rest of the block -- residual, norms, MLP -- is run again on
each of the ``N x N`` zeroed attention outputs (:func:`corrected_distances`): no query, key,
value or output projection and no attention is recomputed. A guard compares the rest of the
block run on the unchanged attention output (computed beside the zeroed ones) with the block's
recorded output; a block it does not reproduce falls back to the copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from heedful.adapters.roles import BlockRoles
from heedful.attribution.contributions import row_normalised, transformed_values
from heedful.attribution.decomposition import (
    BlockRecord,
    affine,
    guard,
    norm_apply,
    position_chunks,
    recordings,
    take,
)
from heedful.engine.memory import Need
from heedful.engine.problem import Problem
from heedful.engine.runner import Copies, Runner, anchors_of
from heedful.errors import InputError, UnsupportedModelError
from heedful.registry import register


@dataclass
class _Zeroing:
    """What the copies' replacements read: the original block inputs ``[B, N, D]`` per layer,
    and the rows of the chunk being run (their examples, the token each zeroes, the width)."""

    originals: list[torch.Tensor]
    example: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    token: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    width: int = 0

    def zero_values(self, values: torch.Tensor) -> torch.Tensor:
        """``[r, w, Hkv*d]`` with row ``r``'s token ``token[r]`` zeroed in every head."""
        keep = torch.ones(values.shape[:2], dtype=values.dtype, device=values.device)
        keep[torch.arange(values.shape[0]), self.token] = 0
        return values * keep[..., None]

    def original_input(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Block ``layer``'s original input for the chunk's rows ``[r, w, D]``."""
        return self.originals[layer][self.example, : self.width].to(hidden)


def _embeds(problem: Problem):
    """The copies' input embeddings when the problem starts from edited ones (else ``None``)."""
    if problem.inputs_embeds is None:
        return None
    return lambda rows, example, width: problem.inputs_embeds[example, :width]


def _originals(problem: Problem, runner: Runner) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every block's input and output for every example ``L x [B, N, D]`` (one pass each)."""
    adapter, batch = problem.adapter, problem.batch
    copies = Copies(torch.arange(len(problem)), embeds=_embeds(problem))
    ins: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    with adapter.intercept() as hooks:
        seen_in, seen_out = hooks.record("block_in"), hooks.record("block_out")
        for chunk in runner.chunks(copies, Need(hidden_states=True, eager=True, anchors=anchors_of(problem.target))):
            embeds = None if copies.embeds is None else copies.embeds(chunk.rows, chunk.example, chunk.width)
            runner.forward(chunk, inputs_embeds=embeds)
            if not ins:
                ins = [h.new_zeros(len(batch), batch.seq_len, h.shape[-1]) for h in seen_in.values()]
                outs = [h.new_zeros(len(batch), batch.seq_len, h.shape[-1]) for h in seen_out.values()]
            for layer in range(len(ins)):
                ins[layer][chunk.example, : chunk.width] = seen_in[layer]
                outs[layer][chunk.example, : chunk.width] = seen_out[layer]
    return ins, outs


def _mlp(block: BlockRoles, z: torch.Tensor) -> torch.Tensor:
    """The block's MLP on vectors ``z`` ``[..., D]``: ``W_down act(W_up z + b_up) + b_down``, or
    with a gate ``W_down (act(W_g z + b_g) * (W_up z + b_up)) + b_down``."""
    w_up, b_up = affine(block.mlp_up, block.transposed)
    w_down, b_down = affine(block.mlp_out, block.transposed)
    act = block.mlp_act.module
    up = torch.nn.functional.linear(z, w_up, b_up)
    if block.mlp_gate is not None:
        w_gate, b_gate = affine(block.mlp_gate, block.transposed)
        hidden = act(torch.nn.functional.linear(z, w_gate, b_gate)) * up
    else:
        hidden = act(up)
    return torch.nn.functional.linear(hidden, w_down, b_down)


def block_tail(block: BlockRoles, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """The rest of a block after its attention output projection: from the block's input ``x``
    and the attention output ``attn`` (bias included) ``[..., D]`` to the block's output --
    pre-LN ``r = x + attn; r + MLP(norm2(r))``, post-LN ``r = norm1(x + attn); norm2(r + MLP(r))``."""
    if block.pre_ln:
        r = x + attn
        return r + _mlp(block, norm_apply(block.mlp_norm, r))
    r = norm_apply(block.attn_norm, x + attn)
    return norm_apply(block.mlp_norm, r + _mlp(block, r))


STATES = 5.0
"""``[N, N, D]`` tensors the corrected distances of one block keep alive at once."""


def _layer_distances(rec: BlockRecord, block: BlockRoles, family: str, layer: int) -> torch.Tensor:
    """``S[b, i, j]`` ``[B, N, N]`` of one block from its recording (see :func:`corrected_distances`)."""
    x, attn, out = rec.block_in, rec.attn_out, rec.block_out
    removed = torch.einsum("bhij,bjhd->bijd", rec.probs, transformed_values(rec, block))  # T'[b, i, j]
    bsz, seq, dim = x.shape
    found = x.new_zeros(bsz, seq, seq, dtype=torch.float64)
    width = rec.mlp_up.shape[-1]
    kept = removed.new_zeros(bsz, seq, 1, dim)  # a last column with nothing zeroed: the original
    original = torch.empty_like(out)
    for pos in position_chunks(seq, bsz * (seq + 1), 2 * width + 4 * dim, int(STATES * bsz * seq * seq * dim)):
        # the original output goes through the very operations of the zeroed ones, so their float
        # rounding is shared and the small distances keep their digits (the recorded output would not)
        removing = torch.cat([removed[:, pos], kept[:, pos]], dim=2)
        outputs = block_tail(block, take(x, pos)[:, :, None], take(attn, pos)[:, :, None] - removing)  # [B, n, N + 1, D]
        cos = torch.nn.functional.cosine_similarity(outputs[:, :, :seq].double(), outputs[:, :, seq:].double(), dim=-1)
        found[:, pos] = (1.0 - cos).clamp_min(0.0).to(found)
        original[:, pos] = outputs[:, :, seq]
    guard(original, out, None, family, f"the rest of block {layer} after its attention")
    return found


def corrected_distances(problem: Problem) -> torch.Tensor:
    """:func:`distances` without copies: per block, the attention output with token ``j``'s
    value vectors zeroed is the recorded one minus ``T'_ij`` (the probabilities do not change),
    and the rest of the block (:func:`block_tail`) runs on all ``N x N`` of them at once.
    Raises :class:`UnsupportedModelError` when a block's rest does not reproduce its output."""
    adapter, batch = problem.adapter, problem.batch
    roles = adapter.roles()
    found = torch.zeros(adapter.num_layers, len(problem), batch.seq_len, batch.seq_len, dtype=torch.float64, device=adapter.device)
    for rec in recordings(problem, "value_zeroing", STATES):
        real = (rec.mask[:, :, None] * rec.mask[:, None, :]).bool()
        for layer, (block, block_rec) in enumerate(zip(roles.blocks, rec.blocks, strict=True)):
            dist = _layer_distances(block_rec, block, adapter.family, layer).double()
            found[layer, rec.rows, : rec.width, : rec.width] = torch.where(real, dist, 0.0)
    return found


def copied_distances(problem: Problem) -> torch.Tensor:
    """:func:`distances` by ``N`` copies of each example through the runner (every family)."""
    adapter, batch = problem.adapter, problem.batch
    runner = Runner.for_problem(problem)
    ins, outs = _originals(problem, runner)
    lengths = batch.lengths
    example = torch.repeat_interleave(torch.arange(len(problem)), lengths)
    token = torch.cat([torch.arange(int(n)) for n in lengths.tolist()])
    copies = Copies(example, embeds=_embeds(problem))
    state = _Zeroing(ins)
    layers = len(ins)
    found = torch.zeros(layers, len(problem), batch.seq_len, batch.seq_len, dtype=torch.float64)
    with adapter.intercept() as hooks:
        hooks.replace("value", state.zero_values)
        for layer in range(1, layers):
            hooks.replace("block_in", lambda h, layer=layer: state.original_input(layer, h), layers=[layer])
        seen = hooks.record("block_out")
        for chunk in runner.chunks(copies, Need(hidden_states=True, eager=True, anchors=anchors_of(problem.target))):
            state.example, state.token, state.width = chunk.example, token[chunk.rows], chunk.width
            embeds = None if copies.embeds is None else copies.embeds(chunk.rows, chunk.example, chunk.width)
            runner.forward(chunk, inputs_embeds=embeds)
            real = batch.attention_mask[chunk.example, : chunk.width].bool()
            positions = torch.arange(chunk.width)
            for layer in range(layers):
                zeroed = seen[layer].double()
                original = outs[layer][chunk.example, : chunk.width].double()
                cos = torch.nn.functional.cosine_similarity(zeroed, original, dim=-1)
                dist = torch.where(real, (1.0 - cos).clamp_min(0.0), 0.0)  # [r, w]
                found[layer][chunk.example[:, None], positions[None, :], state.token[:, None]] = dist
    return found


def distances(problem: Problem) -> torch.Tensor:
    """``S[l, b, i, j]`` ``[L, B, N, N]``: the cosine distance between block ``l``'s output for
    token ``i`` with token ``j``'s value vectors zeroed (the block run on its original input)
    and the original output; 0 beyond each example's tokens. By the attention correction
    (:func:`corrected_distances`) where the roles describe the blocks and its ``O(N^2 D)`` states
    fit ``max_memory``, else by copies (memory linear in the length)."""
    try:
        return corrected_distances(problem)
    except (UnsupportedModelError, InputError):
        return copied_distances(problem)


VALUE_ZEROING_COST = (
    "2 forwards + the rest of every block (norms, MLP) on N x N zeroed attention outputs; O(N^2 D) memory "
    "per layer (else 2 + N forwards: each copy reruns all L blocks, the reference's L x N single-block passes)"
)
"""The prediction's pass, one recording every block, and the blocks' rests (or one pass per zeroed token)."""


@register("value_zeroing", family="vector", cost=VALUE_ZEROING_COST, needs=("roles", "plain_blocks"))
@torch.no_grad()
def value_zeroing(problem: Problem, *, rollout: bool = True, layerwise: bool = False) -> torch.Tensor:
    """Cosine distance of each token's block output when another token's value vectors are zeroed.

    ``S^l[i, j] = cosdist(h~^l_i(j), h^l_i)``: block ``l`` run on its original input ``h^{l-1}``
    with the value vectors of token ``j`` zeroed in every head, against its original output
    (Mohebbi et al. 2023, Eq. 3-4); rows normalised to sum to 1; with ``rollout`` (the paper's
    final scores) the layers multiplied as plain products ``S^L ... S^1`` (no identity: the
    residual is inside the block), without it the matrix of the last layer alone. The anchor's
    row ``[B, N]``; ``layerwise=True``: after each layer ``[B, L, N]``. Task-independent.

    Families: any whose value projections and blocks the roles locate (encoders and decoders;
    grouped-query attention zeroes the token's key/value heads, which every query head reads).

    Source: Mohebbi et al. 2023, Quantifying Context Mixing in Transformers (EACL); reference
    hmohebbi/ValueZeroing (scoring/value_zeroing.py)
    """
    dtype = problem.reference.logits.dtype
    matrices = row_normalised(distances(problem)).to(torch.float64 if dtype == torch.float64 else torch.float32)  # [L, B, N, N]
    rows = torch.arange(len(problem), device=matrices.device)
    joint: torch.Tensor | None = None
    found = []
    for matrix in matrices:
        joint = matrix if joint is None or not rollout else matrix @ joint
        found.append(joint[rows, problem.anchor])
    return torch.stack(found, dim=1) if layerwise else found[-1]
