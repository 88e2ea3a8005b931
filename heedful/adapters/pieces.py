"""Encoding with a tokenizer that gives no character offsets (``transformers``' Python
tokenizers, such as Marian's SentencePiece pair): each token's span is found by reading its
piece in the text.

A SentencePiece piece is the text it stands for, with ``▁`` for the space before a word; its
span is where that text next occurs after the previous token's (a piece the text does not hold
as written -- an unknown token, a normalised character -- gets no span, and the next piece is
looked for from where the last one ended). A token opens a new word where its piece starts with
``▁`` (or after a token without a span).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from heedful.adapters.encoding import check_lengths
from heedful.engine.batch import Batch
from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.adapters.base import ModelAdapter

SPACE_MARKERS = ("▁", "Ġ")


def piece_spans(text: str, tokens: Sequence[str], special: Sequence[bool]) -> tuple[list[tuple[int, int] | None], list[int | None]]:
    """Each token's ``(start, end)`` in ``text`` (``None`` for special tokens and pieces not
    found) and its word number (``None`` where it has no span)."""
    offsets: list[tuple[int, int] | None] = []
    words: list[int | None] = []
    cursor, word = 0, -1
    opened = True
    for token, sp in zip(tokens, special, strict=True):
        piece = token
        starts_word = piece.startswith(SPACE_MARKERS)
        for marker in SPACE_MARKERS:
            piece = piece.replace(marker, " ")
        piece = piece.strip()
        at = text.find(piece, cursor) if piece and not sp else -1
        if at < 0 or text[cursor:at].strip():  # not next in the text: no span
            offsets.append(None)
            words.append(None)
            opened = True
            continue
        if starts_word or opened or at > cursor:
            word += 1
        offsets.append((at, at + len(piece)))
        words.append(word)
        cursor, opened = at + len(piece), False
    return offsets, words


def encode_pieces(adapter: ModelAdapter, texts: list[str], truncation: bool, limit: int) -> Batch:
    """``texts`` encoded by a tokenizer without offsets into a right-padded :class:`Batch`
    (special tokens included, at most ``limit`` tokens each: truncated with a warning, or an
    :class:`InputError` without ``truncation``)."""
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"text {i} is empty" if len(texts) > 1 else "the text is empty", hint="give a text with at least one word")
    tokenizer = adapter.tokenizer
    too_long = check_lengths(tokenizer(texts, truncation=False)["input_ids"], limit, truncation)
    encoded = tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
    specials = set(tokenizer.all_special_ids)
    width = max(len(ids) for ids in encoded)
    pad = adapter.pad_token_id
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    special = torch.zeros(len(texts), width, dtype=torch.bool)
    tokens, offsets, word_ids, seq = [], [], [], []
    for b, (text, row) in enumerate(zip(texts, encoded, strict=True)):
        n = len(row)
        ids[b, :n] = torch.tensor(row, dtype=torch.long)
        mask[b, :n] = 1
        flags = [int(i) in specials for i in row]
        special[b, :n] = torch.tensor(flags, dtype=torch.bool)
        symbols = tokenizer.convert_ids_to_tokens(row)
        spans, words = piece_spans(text, symbols, flags)
        tokens.append(symbols)
        offsets.append(spans)
        word_ids.append(words)
        seq.append([None if sp else 0 for sp in flags])
    return Batch(
        input_ids=ids,
        attention_mask=mask,
        token_type_ids=torch.zeros(len(texts), width, dtype=torch.long),
        special_mask=special,
        texts=list(texts),
        text_pairs=[None] * len(texts),
        tokens=tokens,
        offsets=offsets,
        word_ids=word_ids,
        sequence_ids=seq,
        truncated=[i in too_long for i in range(len(texts))],
    )
