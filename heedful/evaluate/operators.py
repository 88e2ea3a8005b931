"""Removal operators: what "removing" a token means to a perturbation curve, one input builder
per operator behind one evaluator (:func:`heedful.evaluate.perturbation.forward_removed`).

A curve removes the same ranked positions under every operator; only the perturbed input
differs, so a method tuned to one operator can be scored on the others:

``delete``
    the tokens are dropped and the rest closes up (ferret, decoder deletion curves);
``mask`` / ``unk`` / ``pad``
    each is replaced by that special token, the length kept (NormXLogit, Mask-LRP);
``sample``
    each is replaced by a word of the *same part of speech* drawn from a corpus of the model's
    own domain (the movie-review snippets' train split), so the perturbed sentence stays a
    sentence of the kind the model was trained on -- in-distribution replacement, after the
    "realistic counterfactuals" of Ye, Nair & Durrett (2021) and the out-of-distribution
    critique of Hooker et al. (2019). A token's part of speech is spaCy's universal tag of
    the word its first character falls in (``en_core_web_sm``, :func:`heedful.lrp.heads.load_parser`);
    the candidates are the corpus words of that tag that are one token of the model's
    vocabulary (a tag with none draws from all of them). Every position of an example gets one
    replacement drawn from a uniform ``[N]`` seeded with the text (:func:`text_seed`; the same at every
    ratio, so a curve's steps differ only in which positions are replaced; as long as the model's
    longest input, so independent of the batch the example is measured in). minilm-sentiment has no masked-LM head (its base,
    all-MiniLM-L6-v2, ships the encoder only), so the model's own fill-in prediction is not an
    option there; the corpus draw works for any tokenizer.

:data:`CROSS_OPERATORS` are the three a cross-operator evaluation scores every method under.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np
import torch

from heedful.errors import InputError

CROSS_OPERATORS: tuple[str, ...] = ("delete", "mask", "sample")
"""Deletion, special-token replacement (``[MASK]``, or ``[UNK]`` for a tokenizer without a mask
token, :func:`replacement_operator`) and sampled in-distribution replacement."""
SAMPLE_SEED = 0
"""Part of the seed of every example's uniform draw of replacement words (:func:`text_seed`)."""
CORPUS = ("movies", "train", 3000)
"""Where the replacement words come from: (snippet set, split, rows drawn with :data:`SAMPLE_SEED`)."""
ALL_TAGS = "*"
"""The pool key holding every candidate word (for a tag the corpus has no one-token word of)."""

Tagger = Callable[[Sequence[str]], list[list[tuple[int, int, str]]]]
"""``tagger(texts) -> per text, (start, end, universal POS)`` of each word."""


def spacy_words(texts: Sequence[str]) -> list[list[tuple[int, int, str]]]:
    """Words of each text with spaCy's universal part-of-speech tags (``en_core_web_sm``)."""
    from heedful.lrp.heads import load_parser

    nlp = load_parser()
    return [[(t.idx, t.idx + len(t.text), t.pos_) for t in doc] for doc in nlp.pipe(list(texts), batch_size=256)]


_tagger: list[Tagger] = [spacy_words]
_pools: dict[tuple, dict[str, torch.Tensor]] = {}


def use_tagger(tagger: Tagger | None) -> None:
    """Tag words with ``tagger`` from now on (``None``: spaCy again); cached pools are dropped."""
    _tagger[0] = tagger or spacy_words
    _pools.clear()


def replacement_operator(tokenizer) -> str:
    """``"mask"`` where the tokenizer has a mask token, else ``"unk"`` (a causal LM's)."""
    return "mask" if getattr(tokenizer, "mask_token_id", None) is not None else "unk"


def corpus_texts() -> list[str]:
    """The texts the replacement words are drawn from (:data:`CORPUS`)."""
    from heedful.datasets.vader import load_split

    name, split, rows = CORPUS
    frame = load_split(name, split)  # its first rows are nearly all positive: a seeded sample of rows
    return frame.sample(n=min(rows, len(frame)), random_state=SAMPLE_SEED)["text"].tolist()


def pos_pool(tokenizer) -> dict[str, torch.Tensor]:
    """Per universal tag, the sorted distinct token ids of the corpus words of that tag that are
    one token of ``tokenizer`` (with a leading space where the vocabulary marks word starts);
    :data:`ALL_TAGS`: all of them. Cached per tokenizer and tagger."""
    key = (getattr(tokenizer, "name_or_path", ""), len(tokenizer), id(_tagger[0]))
    if key in _pools:
        return _pools[key]
    words: dict[str, set[str]] = {}
    texts = corpus_texts()
    for text, tagged in zip(texts, _tagger[0](texts), strict=True):
        for start, end, pos in tagged:
            words.setdefault(pos, set()).add(text[start:end])
    unk = getattr(tokenizer, "unk_token_id", None)
    specials = set(getattr(tokenizer, "all_special_ids", []))
    pool: dict[str, set[int]] = {}
    for pos, found in words.items():
        ordered = sorted(found)
        for variant in ([" " + w for w in ordered], ordered):
            for ids in tokenizer(variant, add_special_tokens=False)["input_ids"]:
                if len(ids) == 1 and ids[0] != unk and ids[0] not in specials:
                    pool.setdefault(pos, set()).add(int(ids[0]))
    tensors = {pos: torch.tensor(sorted(ids), dtype=torch.long) for pos, ids in pool.items()}
    if not tensors:
        raise InputError("no corpus word is one token of this tokenizer", hint="use another removal operator")
    tensors[ALL_TAGS] = torch.unique(torch.cat(list(tensors.values())))
    _pools[key] = tensors
    return tensors


def token_tags(batch, texts_words: Sequence[Sequence[tuple[int, int, str]]]) -> list[list[str | None]]:
    """Per example, the tag of each real position: that of the word its first character falls in
    (``None``: a special token, or a position of the second text of a pair)."""
    found = []
    for b, words in enumerate(texts_words):
        starts = np.array([w[0] for w in words])
        ends = np.array([w[1] for w in words])
        row: list[str | None] = []
        for offset, seq in zip(batch.offsets[b], batch.sequence_ids[b], strict=True):
            if offset is None or seq not in (0, None) or not len(words):
                row.append(None)
                continue
            inside = np.flatnonzero((starts <= offset[0]) & (offset[0] < ends))
            if not inside.size:  # a leading space in the offsets: the next word
                inside = np.flatnonzero(starts >= offset[0])
            row.append(words[int(inside[0])][2] if inside.size else None)
        found.append(row)
    return found


def text_seed(text: str) -> int:
    """The seed of a text's draw: :data:`SAMPLE_SEED` and the text's CRC-32 (two texts draw
    different words; one text the same words in any batch, on any machine)."""
    return SAMPLE_SEED * 2**32 + zlib.crc32(text.encode("utf-8"))


def sampled_replacements(adapter, batch) -> torch.Tensor:
    """``[B, N]`` long: the in-distribution replacement of every position of ``batch`` (the
    ``sample`` operator, module docstring); positions without a tag keep their own id."""
    pool = pos_pool(adapter.tokenizer)
    tags = token_tags(batch, _tagger[0](batch.texts))
    width = max(int(adapter.max_length), batch.seq_len)  # one draw per position the model takes, whatever the batch
    ids = batch.input_ids.clone()
    for b, row in enumerate(tags):
        draws = torch.rand(width, generator=torch.Generator().manual_seed(text_seed(batch.texts[b])), dtype=torch.float64)
        for i, tag in enumerate(row):
            if tag is None:
                continue
            candidates = pool.get(tag, pool[ALL_TAGS])
            ids[b, i] = candidates[min(int(draws[i] * len(candidates)), len(candidates) - 1)]
    return ids
