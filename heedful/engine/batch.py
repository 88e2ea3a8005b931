"""Batch: many encoded texts, right-padded, with the bookkeeping explanations need."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Batch:
    """Encoded texts. Tensors are ``[B, N]`` (B examples, N = longest length); padding is on the right.

    ``tokens[b]``, ``offsets[b]``, ``word_ids[b]`` and ``special[b]`` cover the ``lengths[b]`` real
    positions of example ``b`` exactly as the tokenizer produced them (special tokens included).
    ``offsets`` are character spans into ``texts[b]`` (or ``text_pairs[b]`` for positions whose
    ``sequence_ids`` entry is 1); ``None`` for special tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    special_mask: torch.Tensor
    texts: list[str]
    text_pairs: list[str | None]
    tokens: list[list[str]]
    offsets: list[list[tuple[int, int] | None]]
    word_ids: list[list[int | None]]
    sequence_ids: list[list[int | None]]
    truncated: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Number of real (non-pad) positions per example, ``[B]``."""
        return self.attention_mask.sum(dim=1)

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    def select(self, indices: list[int]) -> Batch:
        """A sub-batch of the given examples, trimmed to its own longest length."""
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.input_ids.device)
        width = int(self.attention_mask[idx].sum(dim=1).max()) if len(indices) else 0

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx, :width]

        return Batch(
            input_ids=cut(self.input_ids),
            attention_mask=cut(self.attention_mask),
            token_type_ids=cut(self.token_type_ids),
            special_mask=cut(self.special_mask),
            texts=[self.texts[i] for i in indices],
            text_pairs=[self.text_pairs[i] for i in indices],
            tokens=[self.tokens[i] for i in indices],
            offsets=[self.offsets[i] for i in indices],
            word_ids=[self.word_ids[i] for i in indices],
            sequence_ids=[self.sequence_ids[i] for i in indices],
            truncated=[self.truncated[i] for i in indices] if self.truncated else [],
        )

    def cut(self, rows: torch.Tensor, width: int) -> dict[str, torch.Tensor | None]:
        """The model inputs of examples ``rows`` cut to their first ``width`` positions:
        ``input_ids``, ``attention_mask`` and ``token_type_ids`` (``None`` without segments)."""
        types = self.token_type_ids
        return {
            "input_ids": self.input_ids[rows, :width],
            "attention_mask": self.attention_mask[rows, :width],
            "token_type_ids": None if types is None else types[rows, :width],
        }

    def with_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Batch:
        """The same bookkeeping with new ids (used by perturbations; tokens lists are not updated)."""
        return replace(
            self,
            input_ids=input_ids,
            attention_mask=self.attention_mask if attention_mask is None else attention_mask,
        )

    @property
    def content_mask(self) -> torch.Tensor:
        """``[B, N]`` bool: real positions that are not special tokens."""
        return self.attention_mask.bool() & ~self.special_mask
