"""Vector-based methods that read the model's representations: embedding norm, LogAt, NormXLogit.

NormXLogit (Abbasi et al., "NormXLogit: The Head-on-Top Never Lies"): apply the head-on-top to
every token's final representation as if it were the pooled token, and weight the resulting
logit by the norm of the token's input embedding. One forward pass and one batched head call.
"""

from __future__ import annotations

from typing import Literal

import torch

from heedful.adapters import ModelAdapter
from heedful.engine.problem import Problem
from heedful.engine.targets import ResolvedTarget
from heedful.errors import InputError
from heedful.registry import register

NormSource = Literal["embedding_output", "word_embedding"]
RegressionRank = Literal["far", "near"]


def embedding_norms(problem: Problem, norm: str = "embedding_output") -> torch.Tensor:
    """``||x_i^0||_2`` per token ``[B, N]``.

    ``norm="embedding_output"`` (default, as the reference code) uses the embedding module's
    output ``hidden_states[0]`` (word + position/type embeddings, normalised where the model
    does); ``"word_embedding"`` uses the raw word embedding (the paper's wording).
    """
    if norm == "embedding_output":
        return problem.reference_with(hidden_states=True).hidden_states[0].norm(dim=-1)
    if norm == "word_embedding":
        return problem.word_embeddings().norm(dim=-1)
    raise InputError(f"norm must be embedding_output or word_embedding, got {norm!r}")


def _layer_logits(
    adapter: ModelAdapter, target: ResolvedTarget, hidden: torch.Tensor, layer: int, regression_rank: str = "far"
) -> torch.Tensor:
    """LogAt at one layer: head applied to every token of ``hidden`` ``[B, N, D]`` -> ``[B, N]``.

    Classification and LM targets: the (weighted) target logits, paper Eq. 7 (per-label when a
    class is given; a contrast gives logit(A) - logit(B)). Regression: paper Eq. 8,
    ``-|HoT(x_i) - HoT(x_anchor)|`` with ``regression_rank="near"`` (the tokens whose head value
    is nearest the prediction rank first, as the paper's text and results read it: "the [CLS]
    token has a higher degree of similarity to the most important input tokens"), or the printed
    distance ``|HoT(x_i) - HoT(x_anchor)|`` with ``"far"`` (largest distance first).
    """
    bsz, seq, dim = hidden.shape
    flat = hidden.reshape(bsz * seq, dim)
    if target.task == "regression":
        values = adapter.head_at_layer(flat, layer).reshape(bsz, seq)
        rows = torch.arange(bsz)
        distance = (values - values[rows, target.anchor][:, None]).abs()
        return distance if regression_rank == "far" else -distance
    columns = target.classes.repeat_interleave(seq, dim=0)
    picked = adapter.head_at_layer(flat, layer, columns)  # [B*N, K]
    return (picked * target.weights.to(picked)).sum(dim=1).reshape(bsz, seq)


def logit_attribution(problem: Problem, layerwise: bool, regression_rank: str = "far") -> torch.Tensor:
    """LogAt scores ``[B, N]`` from the last layer, or ``[B, L, N]`` for layers 1..L
    (``regression_rank``: see :func:`_layer_logits`)."""
    adapter, target = problem.adapter, problem.target
    hs = problem.reference_with(hidden_states=True).hidden_states
    last = len(hs) - 1
    if not layerwise:
        return _layer_logits(adapter, target, hs[last], last, regression_rank)
    return torch.stack(
        [_layer_logits(adapter, target, hs[layer], layer, regression_rank) for layer in range(1, last + 1)], dim=1
    )


@register("embedding_norm", family="vector", cost="1 forward", needs_hidden=True, reads_logits=False)
@torch.no_grad()
def embedding_norm(problem: Problem, *, norm: NormSource = "embedding_output") -> torch.Tensor:
    """L2 norm of each token's input embedding; task-independent.

    ``||x_i^0||_2`` for every token, ``[B, N]`` (see :func:`embedding_norms` for ``norm``).

    Source: Kobayashi et al. 2020 (norm of input vectors); NormXLogit paper's Norm baseline
    """
    return embedding_norms(problem, norm)


@register("logat", family="vector", cost="1 forward + 1 batched head call", needs_hidden=True, version=2, needs=("head",), reads_logits=False)
@torch.no_grad()
def logat(problem: Problem, *, layerwise: bool = False, regression_rank: RegressionRank = "near") -> torch.Tensor:
    """Head-on-top logit of the target read off every token's final representation.

    LogAt: ``Att(x_i) = HoT(x_i^L)[target]`` (Eq. 7); regression ``-|HoT(x_i^L) - HoT(CLS^L)|``
    (Eq. 8, nearest first; ``regression_rank="far"`` drops the minus sign, the equation as printed).

    Returns ``[B, N]``, or ``[B, L, N]`` with ``layerwise=True`` (head applied to every
    layer's output; pre-LN decoders get their final norm first).

    Source: Abbasi et al. 2025, NormXLogit: The Head-on-Top Never Lies (Eq. 7-9), LogAt (Eq. 7,
    regression Eq. 8)
    """
    return logit_attribution(problem, layerwise, regression_rank)


@register("normxlogit", family="vector", cost="1 forward + 1 batched head call", needs_hidden=True, version=2, needs=("head",), reads_logits=False)
@torch.no_grad()
def normxlogit(
    problem: Problem, *, layerwise: bool = False, norm: NormSource = "embedding_output", regression_rank: RegressionRank = "near"
) -> torch.Tensor:
    """Input-embedding norm x head-on-top logit per token (signed, per label).

    NormXLogit (Eq. 9): ``||x_i^0||_2 * LogAt(x_i)``, signed.

    Classification: the target class's logit (any class for per-label attribution; a
    contrast A vs B gives the logit difference). Regression: Eq. 8 distance to the prediction,
    negated (``regression_rank="near"``: nearest first, so the product ranks tokens with a large
    embedding norm *far* from the prediction last) or as printed (``"far"``). Masked / causal
    LM: the LM head is the head-on-top and the target is a vocabulary token. ``layerwise``
    gives ``[B, L, N]`` (layers 1..L), otherwise ``[B, N]``.

    Source: Abbasi et al. 2025, NormXLogit: The Head-on-Top Never Lies (Eq. 7-9)
    """
    norms = embedding_norms(problem, norm)
    logits = logit_attribution(problem, layerwise, regression_rank)
    return logits * (norms[:, None, :] if layerwise else norms)
