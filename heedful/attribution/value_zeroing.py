"""Value Zeroing (Mohebbi et al. 2023): how much each block's output for one token changes when
another token's value vectors are zeroed, rolled out through the layers.

For block ``l`` and token ``j``, the block is run again on its original input with the value
vectors of ``j`` zeroed in every head; ``S^l[i, j]`` is the cosine distance between the new and
the original output of token ``i``. Every ``(l, j)`` is one single-block pass; heedful runs them
as ``N`` copies of each example through the batched runner (:mod:`heedful.runner`), copy ``j``
zeroing token ``j``'s values in *every* block while each block's input is reset to the original
one -- so one pass of a copy gives block ``l``'s zeroed output for every ``l`` at once, the
``L x N`` single-block passes of the reference in ``N`` forwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from heedful.attribution.contributions import row_normalised
from heedful.memory import Need
from heedful.problem import Problem
from heedful.registry import register
from heedful.runner import Copies, Runner, anchors_of


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


def distances(problem: Problem) -> torch.Tensor:
    """``S[l, b, i, j]`` ``[L, B, N, N]``: the cosine distance between block ``l``'s output for
    token ``i`` with token ``j``'s value vectors zeroed (the block run on its original input)
    and the original output; 0 beyond each example's tokens."""
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


VALUE_ZEROING_COST = "2 + N forwards (batched; each copy reruns all L blocks: the reference's L x N single-block passes)"
"""The prediction's pass, one recording every block's original input and output, one per zeroed token."""


@register("value_zeroing", family="vector", cost=VALUE_ZEROING_COST)
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
    rows = torch.arange(len(problem))
    joint: torch.Tensor | None = None
    found = []
    for matrix in matrices:
        joint = matrix if joint is None or not rollout else matrix @ joint
        found.append(joint[rows, problem.anchor])
    return torch.stack(found, dim=1) if layerwise else found[-1]
