"""Tiny seeded encoder–decoder models for tests and examples: every family of
:data:`heedful.adapters.seq2seq.SEQ2SEQ_FAMILIES` heedful checks, as data (:data:`TINY_SEQ2SEQ`),
and a tiny Marian translation model written to a directory as a hub checkpoint would be
(:func:`build_tiny_marian`: config, safetensors weights and Marian's two SentencePiece models).

The tokenizers are not trained: their pieces are the words and characters of a fixed English and
German corpus, so ids never change between processes. Marian's is ``transformers``'
``MarianTokenizer`` over SentencePiece models written piece by piece; the other families get a
fast SentencePiece-style (unigram) tokenizer that ends every text with ``</s>``.
"""

from __future__ import annotations

import functools
import json
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers as tf

from heedful.model import Model
from heedful.testing import CORPUS

GERMAN = (
    "das haus ist wunderbar",
    "Das Haus ist wunderbar.",
    "der film ist langweilig und vorhersehbar",
    "die hauptstadt von frankreich ist paris",
    "wir haben ihn zweimal gesehen und jede minute geliebt",
    "ein reizender und oft bewegender weg",
    "was für eine verschwendung",
)
"""German sentences whose words the tiny tokenizers hold (the outputs of the examples)."""

ENGLISH = ("The house is wonderful.", "The film is boring.", "What a waste.")

SPECIALS = ("<pad>", "</s>", "<unk>")
"""Ids 0, 1, 2 of every tiny encoder–decoder tokenizer (T5's order)."""


def pieces() -> list[tuple[str, float]]:
    """The tokenizers' pieces and unigram scores: the specials, every word of :data:`CORPUS`,
    :data:`GERMAN` and :data:`ENGLISH` (``▁word``, lower-cased and as written), then every
    character alone and after ``▁`` -- whole words score higher, so they are kept whole."""
    words: list[str] = []
    for line in (*CORPUS, *GERMAN, *ENGLISH):
        for word in line.replace(".", " .").replace(",", " ,").split():
            words.extend((word, word.lower()))
    chars = sorted({c for w in words for c in w})
    found: dict[str, float] = dict.fromkeys(SPECIALS, 0.0)
    for w in dict.fromkeys(words):
        found.setdefault("▁" + w, -2.0)
    for c in chars:
        found.setdefault(c, -8.0)
        found.setdefault("▁" + c, -8.5)
    found.setdefault("▁", -9.0)
    return list(found.items())


@functools.cache
def unigram_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A T5-style fast tokenizer over :func:`pieces`: ``▁`` marks a word's start, ``</s>`` ends
    every text, ``<pad>`` pads."""
    return tf.T5Tokenizer(vocab=pieces(), extra_ids=0, model_max_length=64)


def _spm_model(path: Path) -> None:
    """A SentencePiece unigram model of :func:`pieces` written to ``path`` (``<unk>`` unknown,
    ``<pad>`` and ``</s>`` control pieces; whitespace escaped as ``▁``, a ``▁`` before the text)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    kinds = {"<pad>": pb.ModelProto.SentencePiece.CONTROL, "</s>": pb.ModelProto.SentencePiece.CONTROL, "<unk>": pb.ModelProto.SentencePiece.UNKNOWN}
    for piece, score in pieces():
        entry = model.pieces.add()
        entry.piece, entry.score = piece, score
        entry.type = kinds.get(piece, pb.ModelProto.SentencePiece.NORMAL)
    spec = model.trainer_spec
    spec.model_type = pb.TrainerSpec.UNIGRAM
    spec.vocab_size = len(model.pieces)
    spec.pad_id, spec.eos_id, spec.unk_id, spec.bos_id = 0, 1, 2, -1
    spec.pad_piece, spec.eos_piece, spec.unk_piece = "<pad>", "</s>", "<unk>"
    norm = model.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = True
    norm.remove_extra_whitespaces = True
    norm.escape_whitespaces = True
    path.write_bytes(model.SerializeToString())


def marian_tokenizer(folder: Path) -> tf.MarianTokenizer:
    """``transformers``' Marian tokenizer (English -> German) over SentencePiece models of
    :func:`pieces` written into ``folder`` (the same model for both sides, one vocabulary)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("source.spm", "target.spm"):
        _spm_model(folder / name)
    (folder / "vocab.json").write_text(json.dumps({p: i for i, (p, _) in enumerate(pieces())}), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (it only normalises punctuation)
        return tf.MarianTokenizer(
            str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"), source_lang="en", target_lang="de", model_max_length=64
        )


@dataclass(frozen=True)
class TinySeq2Seq:
    """How to build a tiny model of one encoder–decoder family: its ``config`` class name and
    ``kwargs``; the config keys set to the tokenizer's padding / end / start ids come from
    ``ids`` (``"pad"``, ``"eos"``)."""

    config: str
    kwargs: Mapping[str, Any]
    ids: Mapping[str, str]


_BART_LIKE = {
    "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64, "init_std": 0.1, "dropout": 0.0,
}
_BART_IDS = {"pad_token_id": "pad", "eos_token_id": "eos", "bos_token_id": "eos", "decoder_start_token_id": "eos", "forced_eos_token_id": "eos"}
_PAD_START = {"pad_token_id": "pad", "eos_token_id": "eos", "decoder_start_token_id": "pad"}

TINY_SEQ2SEQ: dict[str, TinySeq2Seq] = {
    "t5": TinySeq2Seq(
        "T5Config",
        {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
         "relative_attention_num_buckets": 8, "dropout_rate": 0.0, "initializer_factor": 4.0},
        _PAD_START,
    ),
    "bart": TinySeq2Seq("BartConfig", _BART_LIKE, _BART_IDS),
    "mbart": TinySeq2Seq("MBartConfig", _BART_LIKE, _BART_IDS),
    "marian": TinySeq2Seq("MarianConfig", {**_BART_LIKE, "scale_embedding": True, "share_encoder_decoder_embeddings": True}, _PAD_START),
    "pegasus": TinySeq2Seq("PegasusConfig", {**_BART_LIKE, "scale_embedding": True}, _PAD_START),
    "m2m_100": TinySeq2Seq("M2M100Config", {**_BART_LIKE, "scale_embedding": True}, {**_BART_IDS, "forced_eos_token_id": "eos"}),
}
"""The tiny configuration of every encoder–decoder family checked (``config.model_type`` ->
:class:`TinySeq2Seq`): 2 encoder and 2 decoder blocks of 4 heads, width 32."""


def tiny_seq2seq_hf(family: str, seed: int = 0, tokenizer=None, **config_overrides: Any):
    """``(hf_model, tokenizer)``: a tiny seeded encoder–decoder of ``family`` (a key of
    :data:`TINY_SEQ2SEQ`), with :func:`unigram_tokenizer` unless ``tokenizer`` is given;
    ``config_overrides`` change its configuration (e.g. ``scale_embedding=False``)."""
    spec = TINY_SEQ2SEQ.get(family)
    if spec is None:
        raise ValueError(f"no tiny encoder–decoder of family {family!r} (one of {', '.join(TINY_SEQ2SEQ)})")
    tokenizer = tokenizer or unigram_tokenizer()
    named = {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id}
    kwargs = {**spec.kwargs, **config_overrides}
    config = getattr(tf, spec.config)(vocab_size=len(tokenizer), **kwargs, **{k: named[v] for k, v in spec.ids.items()})
    torch.manual_seed(seed)
    model = tf.AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    model.eval()
    return model, tokenizer


def tiny_seq2seq(family: str, seed: int = 0, **config_overrides: Any) -> Model:
    """A heedful :class:`~heedful.Model` around :func:`tiny_seq2seq_hf` (Marian with its own
    tokenizer, the others with :func:`unigram_tokenizer`)."""
    from heedful.loading import from_pretrained_objects

    tokenizer = marian_tokenizer(Path(tempfile.mkdtemp(prefix="heedful-marian-"))) if family == "marian" else None
    hf_model, tokenizer = tiny_seq2seq_hf(family, seed, tokenizer, **config_overrides)
    return from_pretrained_objects(hf_model, tokenizer, name=f"tiny-{family}")


OPUS_MT_SHAPE = {
    "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8, "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "max_position_embeddings": 512, "init_std": 0.02,
}
"""The shape of Helsinki-NLP's opus-mt models (for timing a Marian of their size, random weights)."""


def build_tiny_marian(folder: str | Path, seed: int = 0, **config_overrides: Any) -> Path:
    """A tiny seeded Marian English -> German model written to ``folder`` as a checkpoint is
    (``config.json``, ``model.safetensors``, ``generation_config.json``, the tokenizer's
    SentencePiece models and vocabulary): ``heedful.load(folder)`` loads it.
    ``config_overrides``: another shape (e.g. :data:`OPUS_MT_SHAPE`; the vocabulary stays tiny)."""
    folder = Path(folder)
    tokenizer = marian_tokenizer(folder)
    model, _ = tiny_seq2seq_hf("marian", seed, tokenizer, **config_overrides)
    model.generation_config.max_length = 64
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
