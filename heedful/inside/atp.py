"""Attribution patching: the patching grid from one forward and backward pass.

AtP (Nanda 2023; Kramár et al. 2024, "AtP*: An efficient and scalable method for localizing LLM
behaviour to components", Eq. 3) replaces each restoration by its first-order Taylor term
around the corrupted run:

    IE(n) ~ (a_clean(n) - a_corrupted(n)) . dM/da(n) |_corrupted

for every site ``n`` at once -- one clean pass recording the role, one corrupted pass recording it
in the autograd graph, one backward. A cell restoring several sites (a window of layers, a
head at every position) sums their terms. With ``S`` noise samples the terms are averaged over
the samples, as the exact grid averages its scores.

GradDrop (AtP*, Sec. 3.1.2) guards against cancellation between paths: for each layer ``l`` the
gradient is taken with layer ``l``'s attention and MLP outputs cut from the backward (their
forward unchanged), giving ``L`` estimates ``AtP_l(n)``; the estimate is
``1 / (L - 1) * sum_l |AtP_l(n)|``, a magnitude. All ``L x S`` copies run as rows of batched
passes. AtP*'s other correction, the QK fix, recomputes the attention softmax exactly when a
*query or key* is patched; the grids here patch the residual stream and the sub-layers' and
heads' outputs, whose effect reaches the next softmax only through later layers, so it does not
apply.
"""

from __future__ import annotations

import torch

from heedful.adapters import ModelAdapter
from heedful.inside.patching import Runs, forward_rows, grouped, recorded, role_of, rows_per_pass
from heedful.progress import task


def per_site(deltas: list[torch.Tensor], grads: list[torch.Tensor], groups: int) -> torch.Tensor:
    """``[L, N, G]`` first-order terms from per-layer differences and gradients ``[R, N, D]``,
    summed over the features of each of ``G`` groups (heads) and averaged over the ``R`` rows."""
    terms = [(grouped(d, groups) * grouped(g, groups)).sum(dim=-1).mean(dim=0) for d, g in zip(deltas, grads, strict=True)]
    stacked = torch.stack(terms)  # [L, N] or [L, N, H]
    return stacked if groups > 1 else stacked[..., None]


def cell_sums(terms: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
    """``[C]``: each cell's terms ``[L, N, G]`` summed over the sites it restores ``[C, L, N, G]``."""
    return (restore.to(terms.dtype) * terms[None]).flatten(1).sum(dim=1)


def attribution_patching(
    adapter: ModelAdapter, runs: Runs, kind: str, clean_states: list[torch.Tensor], restore: torch.Tensor
) -> torch.Tensor:
    """AtP's estimate of each cell's indirect effect ``[C]`` (cells ``restore`` ``[C, L, N, G]``;
    ``clean_states`` per layer ``[1, N, ...]``); the ``S`` corrupted rows in as few passes as the
    memory budget allows."""
    rows = rows_per_pass(adapter, runs.width, grad=True)
    total = torch.zeros(restore.shape[1:], dtype=torch.float32, device=runs.corrupted.device)
    for start in range(0, runs.samples, rows):
        embeds = runs.corrupted[start : start + rows].detach().requires_grad_(True)
        with torch.enable_grad():
            states, scores = recorded(adapter, runs, embeds, kind)
            grads = torch.autograd.grad(scores.sum(), states)
        deltas = [clean - state.detach() for clean, state in zip(clean_states, states, strict=True)]
        total += per_site(deltas, grads, restore.shape[-1]) * embeds.shape[0]
    return cell_sums(total / runs.samples, restore.to(total.device)).cpu()


def _cut(rows: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` ``[R, ...]`` with no gradient through the rows ``rows`` ``[R]`` (forward unchanged)."""
    shape = (-1,) + (1,) * (value.dim() - 1)
    return torch.where(rows.view(shape), value.detach(), value)


def graddrop(adapter: ModelAdapter, runs: Runs, kind: str, clean_states: list[torch.Tensor], restore: torch.Tensor) -> torch.Tensor:
    """AtP* GradDrop's magnitude estimate ``[C]``: ``1 / (L - 1) * sum_l |AtP_l|``, where
    ``AtP_l`` takes the gradient with layer ``l``'s attention and MLP outputs cut from the backward.

    Rows ``l * S + s`` (dropped layer ``l``, sample ``s``) run in as few passes as memory allows."""
    layers, samples = restore.shape[1], runs.samples
    total = layers * samples
    rows = rows_per_pass(adapter, runs.width, grad=True)
    device = runs.corrupted.device
    per_layer = torch.zeros((layers, *restore.shape[1:]), dtype=torch.float32, device=device)
    starts = range(0, total, rows)
    with task("gradient dropout", len(starts), shown=len(starts) > 1) as progress:
        for start in starts:
            index = torch.arange(start, min(start + rows, total), device=device)
            dropped = index // samples
            embeds = runs.corrupted[index % samples].detach().requires_grad_(True)
            with torch.enable_grad(), adapter.intercept() as hooks:
                for layer in dropped.unique().tolist():
                    for role in ("attn_out", "mlp_out"):
                        hooks.replace(role, lambda v, rows=dropped == layer: _cut(rows, v), layers=[layer])
                found = hooks.record(role_of(kind))
                scores = runs.readout(forward_rows(adapter, runs, embeds))
                states = [found[layer] for layer in sorted(found)]
                grads = torch.autograd.grad(scores.sum(), states)
            for layer in dropped.unique().tolist():
                mine = dropped == layer
                deltas = [clean - state.detach()[mine] for clean, state in zip(clean_states, states, strict=True)]
                per_layer[layer] += per_site(deltas, [g[mine] for g in grads], restore.shape[-1]) * int(mine.sum())
            progress.advance()
    estimates = torch.stack([cell_sums(per_layer[layer] / samples, restore.to(device)) for layer in range(layers)])
    return (estimates.abs().sum(dim=0) / max(layers - 1, 1)).cpu()
