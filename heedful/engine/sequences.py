"""Token sequences that go on past their text: a prompt followed by a continuation (a span to
explain, a forced or a generated answer), kept as token ids -- never re-tokenized, so that the
ids the model saw are the ids explained -- with offsets into the joined text.

>>> import heedful
>>> lm = heedful.load("smollm2-135m")                                        # doctest: +SKIP
>>> batch = lm.encode(["The capital of France is"])                          # doctest: +SKIP
>>> longer = continue_batch(lm.adapter, batch, [lm.tokenizer(" Paris.")["input_ids"]])  # doctest: +SKIP
>>> longer.texts[0], longer.tokens[0][-2:]                                   # doctest: +SKIP
('The capital of France is Paris.', ['ĠParis', '.'])
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from heedful.engine.batch import Batch
from heedful.errors import Hint, InputError

if TYPE_CHECKING:
    from heedful.adapters.base import ModelAdapter


def span_ids(adapter: ModelAdapter, text: str) -> list[int]:
    """The ids of ``text`` as a continuation: tokenized alone, without special tokens (so
    ``" Paris"`` keeps its leading space, as it would follow a prompt)."""
    ids = adapter.continuation_ids(text)
    if not ids:
        raise InputError(f"target {text!r} has no tokens", hint="give the text the model should continue with")
    return list(ids)


def check_new_tokens(max_new_tokens: int) -> None:
    """An :class:`InputError` unless ``max_new_tokens`` is a whole number of at least 1."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise InputError(f"max_new_tokens must be a whole number, got {max_new_tokens!r}", hint=Hint("e.g. max_new_tokens=12", "e.g. --generate 12"))
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}", hint=Hint("e.g. max_new_tokens=12", "e.g. --generate 12"))


def check_positions(adapter: ModelAdapter, lengths: Sequence[int], added: Sequence[int], generated: bool = False) -> None:
    """An :class:`InputError`, before any work, when a text of ``lengths[b]`` tokens followed by
    ``added[b]`` more (a continuation, or ``generated`` tokens asked for) does not fit the
    model's positions (:meth:`~heedful.adapters.ModelAdapter.positions_needed` of
    :attr:`~heedful.adapters.ModelAdapter.position_limit`: an encoder–decoder's longer side)."""
    limit = adapter.position_limit
    total = [adapter.positions_needed(int(n), int(m)) for n, m in zip(lengths, added, strict=True)]
    over = [b for b, n in enumerate(total) if limit is not None and n > limit]
    if not over:
        return
    b = max(over, key=lambda i: total[i])
    where = f"text {b}" if len(total) > 1 else "the text"
    if generated:
        room = max(0, limit - max(int(lengths[i]) for i in over))
        raise InputError(
            f"{where} ({int(lengths[b]):,} tokens) + {int(added[b]):,} new tokens needs {total[b]:,} positions; "
            f"the model accepts at most {limit:,}",
            hint=f"generate at most {room:,} tokens (--generate / max_new_tokens), or shorten the text"
            if room
            else "shorten the text: it fills the model's positions",
        )
    raise InputError(
        f"{where} with its continuation is {total[b]:,} tokens; the model accepts at most {limit:,}",
        hint="shorten the text or the continuation (or generate fewer tokens)",
    )


def continue_batch(adapter: ModelAdapter, batch: Batch, continuations: Sequence[Sequence[int]]) -> Batch:
    """``batch`` with each example's real tokens followed by its continuation ids.

    ``continuations[b]``: token ids appended after example ``b``'s last real token (on its side:
    with its token type, where the batch has types -- an encoder–decoder's target side). The text of
    each example becomes its text plus the decoded continuation (special tokens such as an end
    of sequence are kept as tokens, marked special, and add no text); each continuation token
    gets its character span in the joined text (without leading spaces) and a word number after the text's words (words
    as the tokenizer's pre-tokenizer splits them). Right-padded ``[B, N']``.
    """
    if len(continuations) != len(batch):
        raise InputError(f"{len(continuations)} continuations for {len(batch)} examples")
    tokenizer = adapter.tokenizer
    special_ids = set(tokenizer.all_special_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lengths = batch.lengths.tolist()
    total = [n + len(c) for n, c in zip(lengths, continuations, strict=True)]
    check_positions(adapter, lengths, [len(c) for c in continuations])
    width = max(total)
    ids = torch.full((len(batch), width), pad, dtype=batch.input_ids.dtype)
    mask = torch.zeros(len(batch), width, dtype=batch.attention_mask.dtype)
    special = torch.zeros(len(batch), width, dtype=torch.bool)
    sides = None if batch.token_type_ids is None else torch.zeros(len(batch), width, dtype=batch.token_type_ids.dtype)
    texts, tokens, offsets, word_ids, seq_ids = [], [], [], [], []
    for b, (n, cont) in enumerate(zip(lengths, continuations, strict=True)):
        cont = [int(i) for i in cont]
        ids[b, :n] = batch.input_ids[b, :n]
        ids[b, n : n + len(cont)] = torch.tensor(cont, dtype=ids.dtype)
        mask[b, : n + len(cont)] = 1
        special[b, :n] = batch.special_mask[b, :n]
        if sides is not None:
            sides[b, :n] = batch.token_type_ids[b, :n]
            sides[b, n : n + len(cont)] = batch.token_type_ids[b, n - 1]
        is_special = [i in special_ids for i in cont]
        special[b, n : n + len(cont)] = torch.tensor(is_special, dtype=torch.bool)
        lead = _lead_id(batch, b, n, special_ids)
        text, spans = _decoded_spans(tokenizer, batch.texts[b], lead, cont, is_special)
        texts.append(text)
        tokens.append(list(batch.tokens[b]) + tokenizer.convert_ids_to_tokens(cont))
        offsets.append(list(batch.offsets[b]) + spans)
        word_ids.append(list(batch.word_ids[b]) + _word_numbers(tokenizer, text, spans, batch.word_ids[b]))
        seq_ids.append(list(batch.sequence_ids[b]) + [None if s else 0 for s in is_special])
    return Batch(
        input_ids=ids,
        attention_mask=mask,
        token_type_ids=sides,
        special_mask=special,
        texts=texts,
        text_pairs=[None] * len(batch),
        tokens=tokens,
        offsets=offsets,
        word_ids=word_ids,
        sequence_ids=seq_ids,
        truncated=list(batch.truncated) if batch.truncated else [],
    )


def _lead_id(batch: Batch, b: int, n: int, special_ids: set[int]) -> int | None:
    """The last real, non-special token of example ``b`` on the continuation's side (decoded in
    front of the continuation so that tokenizers which drop a leading space at the start of a
    decode keep it)."""
    types = batch.token_type_ids
    for pos in range(n - 1, -1, -1):
        if types is not None and int(types[b, pos]) != int(types[b, n - 1]):
            return None
        token = int(batch.input_ids[b, pos])
        if token not in special_ids:
            return token
    return None


def _decoded_spans(
    tokenizer, text: str, lead: int | None, cont: list[int], is_special: list[bool]
) -> tuple[str, list[tuple[int, int] | None]]:
    """The joined text and each continuation token's ``(start, end)`` in it (``None`` for
    special tokens), from decoding the growing continuation after ``lead``."""
    prefix = [] if lead is None else [lead]

    def decoded(ids: list[int]) -> str:
        return tokenizer.decode(prefix + ids, clean_up_tokenization_spaces=False)

    base = len(decoded([]))
    kept: list[int] = []
    spans: list[tuple[int, int] | None] = []
    end = 0
    for token, sp in zip(cont, is_special, strict=True):
        if sp:
            spans.append(None)
            continue
        kept.append(token)
        now = max(end, len(decoded(kept)) - base)
        spans.append((len(text) + end, len(text) + now))
        end = now
    joined = text + decoded(kept)[base:]
    # leading spaces are not part of a token's span, as the fast tokenizers' offsets have it
    return joined, [None if s is None else (_first_visible(joined, s), s[1]) for s in spans]


def _word_numbers(
    tokenizer, text: str, spans: list[tuple[int, int] | None], before: list[int | None]
) -> list[int | None]:
    """Word numbers of continuation tokens ``spans``, after the text's own (``before``): tokens
    starting inside the same pre-tokenizer piece of ``text`` share a word."""
    starts = _piece_starts(tokenizer, text)
    first_word = max((w for w in before if w is not None), default=-1) + 1
    pieces = [None if s is None else bisect.bisect_right(starts, _first_visible(text, s)) - 1 for s in spans]
    real = [p for p in pieces if p is not None]
    if not real:
        return [None] * len(spans)
    return [None if p is None else first_word + p - real[0] for p in pieces]


def _first_visible(text: str, span: tuple[int, int]) -> int:
    """The first non-space character of ``text[span]`` (its start when it is all space)."""
    piece = text[span[0] : span[1]]
    return span[0] + (len(piece) - len(piece.lstrip()) if piece.strip() else 0)


def _piece_starts(tokenizer, text: str) -> list[int]:
    """Start characters of the words of ``text`` as the tokenizer's pre-tokenizer splits them
    (at whitespace for tokenizers without one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = None if backend is None else backend.pre_tokenizer
    if pre is not None:
        return [start for _, (start, _) in pre.pre_tokenize_str(text)]
    starts, previous = [], " "
    for i, ch in enumerate(text):
        if not ch.isspace() and previous.isspace():
            starts.append(i)
        previous = ch
    return starts or [0]
