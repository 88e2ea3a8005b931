"""Perturbation methods that remove tokens and watch the output."""

from __future__ import annotations

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution._common import output_of, score_perturbed
from heedful.batch import Batch
from heedful.errors import InputError
from heedful.perturb import Perturbed, remove_tokens
from heedful.registry import register
from heedful.targets import ResolvedTarget

REMOVALS = ("auto", "mask", "pad", "unk", "delete")


def removal_id(adapter: ModelAdapter, removal: str) -> int | None:
    """Token id that replaces a removed token (``None``: delete it)."""
    if removal == "auto":
        return adapter.removal_token_id
    if removal == "delete":
        return None
    attr = {"mask": "mask_token_id", "pad": "pad_token_id", "unk": "unk_token_id"}.get(removal)
    if attr is None:
        raise InputError(f"unknown removal {removal!r}", hint=f"use one of {', '.join(REMOVALS)}")
    token = adapter.pad_token_id if removal == "pad" else getattr(adapter.tokenizer, attr, None)
    if token is None:
        raise InputError(f"this tokenizer has no {removal} token", hint="use removal='delete' or 'auto'")
    return int(token)


def removable_positions(batch: Batch, target: ResolvedTarget) -> torch.Tensor:
    """``[B, N]`` bool: content tokens that may be removed (not special, not a fixed anchor)."""
    allowed = batch.content_mask.clone()
    if target.anchor_kind == "fixed":
        allowed[torch.arange(len(batch)), target.anchor] = False
    return allowed


def never_empty(adapter: ModelAdapter, perturbed: Perturbed) -> Perturbed:
    """Rows whose every token was deleted (a decoder without BOS, all tokens removed) become the
    one-token input ``[BOS]`` (or the pad/EOS token): a model cannot run on nothing, and the
    result must not depend on what the padding happens to hold."""
    empty = perturbed.attention_mask.sum(dim=1) == 0
    if not empty.any():
        return perturbed
    bos = getattr(adapter.tokenizer, "bos_token_id", None)
    token = adapter.pad_token_id if bos is None else int(bos)
    ids, mask = perturbed.input_ids.clone(), perturbed.attention_mask.clone()
    ids[empty, 0], mask[empty, 0] = token, 1
    anchor = torch.where(empty, torch.zeros_like(perturbed.anchor), perturbed.anchor)
    return Perturbed(ids, mask, perturbed.token_type_ids, anchor)


def remove_from_examples(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    example: torch.Tensor,
    remove: torch.Tensor,
    removal: str = "auto",
) -> Perturbed:
    """Copies of examples ``example`` ``[R]`` of ``batch`` with the ``remove`` ``[R, N]``
    positions removed by ``removal`` (see :func:`removal_id`); no row is left empty."""
    types = None if batch.token_type_ids is None else batch.token_type_ids[example]
    perturbed = remove_tokens(
        batch.input_ids[example],
        batch.attention_mask[example],
        remove,
        target.anchor[example],
        target.anchor_kind,
        removal_id(adapter, removal),
        adapter.pad_token_id,
        types,
    )
    return never_empty(adapter, perturbed)


@register(
    "leave_one_out",
    family="perturbation",
    cost="1 + N forwards (batched)",
    citation="Li et al. 2016, Understanding Neural Networks through Representation Erasure (Eq. 2)",
    summary="Output drop when each token alone is removed (replaced by [MASK], or deleted for causal LMs).",
    defaults={"removal": "auto", "output": "logit"},
)
@torch.no_grad()
def leave_one_out(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward,
    removal: str = "auto",
    output: str = "logit",
    internal_batch_size: int | None = None,
) -> torch.Tensor:
    """``LOO_i = f(x) - f(x \\ x_i)`` for every removable token; 0 for special tokens ``[B, N]``.

    ``removal="auto"`` uses the model's removal token (``[MASK]`` for encoders; deletion for
    causal LMs); ``output`` chooses the target logit or its probability as ``f``. All ``sum_b
    N_b`` perturbed copies run as chunked batches.
    """
    allowed = removable_positions(batch, target)
    example, position = allowed.nonzero(as_tuple=True)  # one perturbed copy per removable token
    rows = example.shape[0]
    remove = torch.zeros(rows, batch.seq_len, dtype=torch.bool)
    remove[torch.arange(rows), position] = True
    perturbed = remove_from_examples(adapter, batch, target, example, remove, removal)
    original = output_of(target, reference.logits, output)
    changed = score_perturbed(adapter, batch, target, perturbed, example, output, internal_batch_size)
    scores = torch.zeros(batch.input_ids.shape, dtype=original.dtype)
    scores[example, position] = original[example] - changed
    return scores
