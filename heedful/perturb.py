"""Removing tokens from encoded inputs: replacement by a token id, or deletion with re-padding.

Shared by the perturbation methods (leave-one-out, LIME, ...) and the faithfulness metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
