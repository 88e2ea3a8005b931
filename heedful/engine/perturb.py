"""Removing tokens from encoded inputs: replacement by a token id, or deletion with re-padding.

Shared by the perturbation methods (leave-one-out, LIME, ...), the faithfulness metrics and the
applications that erase tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.adapters import ModelAdapter
    from heedful.engine.batch import Batch
    from heedful.engine.targets import ResolvedTarget

Removal = Literal["auto", "mask", "pad", "unk", "delete"]
REMOVALS: tuple[str, ...] = ("auto", "mask", "pad", "unk", "delete")


@dataclass
class Perturbed:
    """Perturbed copies ``[R, N]`` of examples, with the anchor position of each copy ``[R]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    anchor: torch.Tensor


def remove_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    remove: torch.Tensor,
    anchor: torch.Tensor,
    anchor_kind: str,
    replacement_id: int | None,
    pad_id: int,
    token_type_ids: torch.Tensor | None = None,
) -> Perturbed:
    """Remove the ``remove`` ``[R, N]`` positions of each row.

    With ``replacement_id`` the ids are overwritten and the length kept; with ``None`` the
    tokens are deleted, the rest shifted left and right-padded with ``pad_id``. The anchor
    follows the deletion: ``"first"`` stays, ``"last"`` becomes the new last token, ``"fixed"``
    moves left by the number of deleted positions before it.
    """
    remove = remove.bool() & attention_mask.bool()
    if replacement_id is not None:
        ids = torch.where(remove, torch.full_like(input_ids, replacement_id), input_ids)
        return Perturbed(ids, attention_mask, token_type_ids, anchor)
    keep = attention_mask.bool() & ~remove
    # stable sort puts kept positions first, in their original order
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    new_mask = keep.gather(1, order)
    ids = torch.where(new_mask, input_ids.gather(1, order), torch.full_like(input_ids, pad_id))
    types = None if token_type_ids is None else token_type_ids.gather(1, order) * new_mask
    if anchor_kind == "last":
        new_anchor = (new_mask.sum(dim=1) - 1).clamp(min=0)
    elif anchor_kind == "fixed":
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        before = (remove & (positions[None, :] < anchor[:, None])).sum(dim=1)
        new_anchor = anchor - before
    else:
        new_anchor = anchor
    width = max(int(new_mask.sum(dim=1).max()), 1)
    return Perturbed(
        ids[:, :width],
        new_mask[:, :width].to(attention_mask.dtype),
        None if types is None else types[:, :width],
        new_anchor,
    )


def removal_id(adapter: ModelAdapter, removal: str) -> int | None:
    """Token id that replaces a removed token (``None``: delete it). ``"auto"``: the model's
    removal token (``[MASK]`` for encoders, deletion for causal LMs)."""
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


def trailing_special_positions(batch: Batch) -> torch.Tensor:
    """``[B, N]`` bool: special tokens after an example's first content token (``[SEP]``,
    ``</s>``; a leading ``[CLS]`` / ``<s>`` / BOS is not one)."""
    real = batch.attention_mask.bool()
    special = batch.special_mask.bool() & real
    positions = torch.arange(batch.seq_len, device=real.device)[None, :]
    first_content = torch.where(real & ~special, positions, batch.seq_len).min(dim=1).values  # [B]
    return special & (positions > first_content[:, None])


def removable_positions(batch: Batch, target: ResolvedTarget, trailing_specials: bool = False) -> torch.Tensor:
    """``[B, N]`` bool: content tokens that may be removed (not special, not a fixed anchor);
    with ``trailing_specials`` the special tokens after the first content token too."""
    allowed = batch.content_mask.clone()
    if trailing_specials:
        allowed |= trailing_special_positions(batch).to(allowed.device)
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
