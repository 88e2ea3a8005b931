"""Encoding and labels: texts into a :class:`~heedful.engine.batch.Batch`, the anchor each example
is explained at, the model's outputs by name, and tokens as people read them (the
:class:`~heedful.adapters.ModelAdapter`'s tokenizer side)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from heedful.engine.batch import Batch
from heedful.engine.readable import readable_tokens
from heedful.errors import Hint, InputError, did_you_mean


def check_lengths(encoded: Sequence[Sequence[int]], limit: int, truncation: bool) -> list[int]:
    """The texts whose untruncated ids ``encoded`` pass ``limit`` tokens: refused in one line
    without ``truncation``, else truncated with a warning."""
    lengths = [len(ids) for ids in encoded]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if too_long and not truncation:
        raise InputError(
            f"text {too_long[0]} has {lengths[too_long[0]]} tokens; the model accepts at most {limit}",
            hint=Hint("shorten the text, or allow truncation (truncation=True)", "shorten the text, or allow truncation (drop --no-truncate)"),
        )
    if too_long:
        warnings.warn(f"{len(too_long)} text(s) longer than {limit} tokens were truncated", stacklevel=4)
    return too_long


class Encoding:
    """The tokenizer side of :class:`~heedful.adapters.ModelAdapter` (mixed into it): reads its
    ``tokenizer``, ``task`` and config, and the family's ``is_decoder`` and ``token_types``."""

    tokenizer: object
    task: str

    @property
    def uses_token_types(self) -> bool:
        if self.token_types is not None:
            return self.token_types
        return getattr(self.hf_model.config, "type_vocab_size", 0) > 0

    @property
    def labels(self) -> list[str]:
        """Output names: class labels for classifiers, ``["value"]`` for regression."""
        if self.task == "regression":
            return ["value"]
        if self.task == "classification":
            id2label = getattr(self.config, "id2label", None) or {}
            n = self.config.num_labels
            return [str(id2label.get(i, f"LABEL_{i}")) for i in range(n)]
        return []

    @property
    def max_length(self) -> int:
        """Longest input the model accepts, in tokens."""
        # RoBERTa reserves padding_idx + 1 position embeddings (514 positions -> 512 tokens);
        # the tokenizer's model_max_length already counts tokens.
        offset = 2 if self.family == "roberta" else 0
        positions = getattr(self.config, "max_position_embeddings", None)
        limits = [positions - offset if positions else None] + [
            getattr(self.config, attr, None) for attr in ("n_positions", "max_seq_len")
        ]
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < 1_000_000:
            limits.append(tok_max)
        limits = [int(x) for x in limits if x]
        return min(limits) if limits else 512

    @property
    def removal_token_id(self) -> int | None:
        """Token that stands for a removed token: ``[MASK]`` where the vocabulary has one;
        ``None`` means removal is deletion (causal LMs, which see no mask token in training)."""
        if self.is_decoder:
            return None
        mask_id = getattr(self.tokenizer, "mask_token_id", None)
        if mask_id is not None:
            return int(mask_id)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return None if unk is None else int(unk)

    @property
    def pad_token_id(self) -> int:
        for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if value is not None:
                return int(value)
        return 0

    def encode(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str | None] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
    ) -> Batch:
        """Tokenize texts (and optional second segments) into a right-padded :class:`Batch`.

        Raises :class:`InputError` for empty texts, and for texts longer than the model accepts
        when ``truncation`` is False; truncation otherwise happens with a warning.
        """
        texts = list(texts)
        if not texts:
            raise InputError("no text given", hint="pass at least one non-empty text")
        pairs = list(text_pairs) if text_pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise InputError(f"{len(texts)} texts but {len(pairs)} text pairs")
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise InputError(
                    f"text {i} is empty" if len(texts) > 1 else "the text is empty",
                    hint="give a text with at least one word",
                )
            bad = _lone_surrogate(text)
            if bad is not None:
                raise InputError(
                    f"{'text ' + str(i) if len(texts) > 1 else 'the text'} holds an unpaired surrogate (U+{ord(text[bad]):04X}) at character {bad}",
                    hint="the text is not valid Unicode: decode it from its bytes again (e.g. errors='replace')",
                )
        for i, pair in enumerate(pairs):
            if pair is not None and (not isinstance(pair, str) or _lone_surrogate(pair) is not None):
                raise InputError(f"text pair {i} is not a valid Unicode string", hint="give each text pair as a str")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
            raise InputError(f"max_length must be a positive integer, got {max_length!r}", hint=f"e.g. max_length={self.max_length}, or leave it unset")
        limit = min(max_length or self.max_length, self.max_length)
        has_pairs = any(p is not None for p in pairs)
        if has_pairs and any(p is None for p in pairs):
            raise InputError("either every text has a pair or none does")

        args = (texts, pairs) if has_pairs else (texts,)
        too_long = check_lengths(self.tokenizer(*args, truncation=False)["input_ids"], limit, truncation)
        enc = self.tokenizer(
            *args,
            padding=True,
            truncation=True,
            max_length=limit,
            return_tensors="pt",
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            # models that embed segment types get them even if the tokenizer does not return
            # them by default (its model_input_names)
            return_token_type_ids=True if self.uses_token_types else None,
            padding_side="right",
        )
        return self._batch_from_encoding(enc, texts, pairs, [i in too_long for i in range(len(texts))])

    def _batch_from_encoding(self, enc, texts, pairs, truncated) -> Batch:
        ids = enc["input_ids"]
        mask = enc["attention_mask"]
        tokens, offsets, word_ids, seq_ids = [], [], [], []
        special = enc["special_tokens_mask"].bool() & mask.bool()
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            tokens.append(self.tokenizer.convert_ids_to_tokens(ids[b, :n].tolist()))
            sids = enc.sequence_ids(b)[:n]
            wids = enc.word_ids(b)[:n]
            offs = enc["offset_mapping"][b, :n].tolist()
            seen: dict[tuple[int, int], int] = {}
            words: list[int | None] = []
            for s, w in zip(sids, wids, strict=True):
                if s is None or w is None:
                    words.append(None)
                else:
                    words.append(seen.setdefault((s, w), len(seen)))
            tokens_special = special[b, :n].tolist()
            offsets.append(
                [None if sp else (int(o[0]), int(o[1])) for o, sp in zip(offs, tokens_special, strict=True)]
            )
            word_ids.append([None if sp else w for w, sp in zip(words, tokens_special, strict=True)])
            seq_ids.append(sids)
        token_types = enc.get("token_type_ids") if self.uses_token_types else None
        return Batch(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=token_types,
            special_mask=special,
            texts=texts,
            text_pairs=pairs,
            tokens=tokens,
            offsets=offsets,
            word_ids=word_ids,
            sequence_ids=seq_ids,
            truncated=truncated,
        )

    @property
    def position_limit(self) -> int:
        """The positions one sequence may take (:attr:`max_length`)."""
        return self.max_length

    def positions_needed(self, length: int, added: int) -> int:
        """Positions a row of ``length`` tokens continued by ``added`` more takes."""
        return length + added

    def continuation_ids(self, text: str) -> list[int]:
        """``text`` tokenized as a continuation of a text: alone, without special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def anchor_positions(self, batch: Batch) -> tuple[torch.Tensor, str]:
        """Position whose head output is explained, ``[B]``, and how it moves under deletion."""
        last = batch.lengths - 1
        if self.task == "causal_lm":
            return last, "last"
        if self.task == "masked_lm":
            mask_id = getattr(self.tokenizer, "mask_token_id", None)
            found = batch.input_ids == mask_id
            missing = (~found.any(dim=1)).nonzero().flatten().tolist()
            if missing:
                raise InputError(
                    f"text {missing[0]} has no {self.tokenizer.mask_token} token to explain",
                    hint=f"put {self.tokenizer.mask_token} where the word to predict goes",
                )
            return found.int().argmax(dim=1), "fixed"
        if self.is_decoder:
            return last, "last"
        return torch.zeros(len(batch), dtype=torch.long, device=batch.input_ids.device), "first"

    def output_index(self, value: int | str) -> int:
        """Column of a class (index or label) or of a vocabulary token.

        For a classifier, a string of digits that is not a label is a class index (``"1"`` from
        the command line). For a language model a string is always a token (``"5"`` is the token
        5) and an int is a token id.
        """
        if self.task == "classification":
            labels = self.labels
            if isinstance(value, str) and value.strip().lstrip("-").isdigit() and value.lower() not in {
                lab.lower() for lab in labels
            }:
                value = int(value.strip())
            if isinstance(value, int):
                if not 0 <= value < len(labels):
                    raise InputError(
                        f"class index {value} is out of range for {len(labels)} classes",
                        hint=f"use 0..{len(labels) - 1} or a label: {', '.join(labels)}",
                    )
                return value
            folded = {lab.lower(): i for i, lab in enumerate(labels)}
            if value.lower() not in folded:
                raise InputError(
                    f"unknown label {value!r}",
                    hint=did_you_mean(value, labels, "label", listing=f"the model's labels are: {', '.join(labels)}"),
                )
            return folded[value.lower()]
        if self.task in ("masked_lm", "causal_lm"):
            return self.token_column(
                value, "give a single token (for next-token targets include its leading space, e.g. ' Paris')"
            )
        raise InputError(f"a {self.task} model has no classes to choose from")

    def token_column(self, value: int | str, several: str) -> int:
        """The vocabulary column of a token target: an id in range, or a string that tokenizes
        (as a continuation) to one token; ``several`` is the hint when it is more."""
        if isinstance(value, int):
            vocab = getattr(self.config, "vocab_size", None)
            if value < 0 or (vocab is not None and value >= vocab):
                raise InputError(
                    f"token id {value} is out of range for a vocabulary of {vocab} tokens",
                    hint="give a token id in 0..vocab_size-1, or the token itself as a string",
                )
            return value
        ids = self.continuation_ids(value)
        if len(ids) != 1:
            pieces = self.tokenizer.convert_ids_to_tokens(ids)
            raise InputError(
                f"target {value!r} is {len(ids)} tokens ({pieces}); a token target must be one token", hint=several
            )
        return int(ids[0])

    def output_name(self, index: int) -> str:
        """The name of output column ``index`` as people read it: a class label, ``"value"``, or
        a vocabulary token decoded (:func:`heedful.engine.readable.readable_tokens`)."""
        if self.task == "classification":
            return self.labels[index]
        if self.task == "regression":
            return "value"
        return self.readable_tokens([int(index)])[0]

    def readable_tokens(self, ids: Sequence[int], raw: Sequence[str] | None = None) -> list[str]:
        """The tokens ``ids`` as people read them (``raw``: their tokenizer symbols, when known)."""
        raw = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]) if raw is None else raw
        return readable_tokens(self.tokenizer, ids, raw)


def _lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a surrogate code point (which UTF-8 cannot encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None

