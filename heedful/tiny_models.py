"""Tiny models of every family for tests: randomly initialised, seeded, with real fast
tokenizers built in memory from :data:`CORPUS` -- nothing is downloaded. :data:`TINY_FAMILIES`
is the table of their configurations (one :class:`TinyFamily` row per ``model_type``: a new
family adds a row, not a branch in a test); :func:`tiny_hf` builds the ``transformers`` model
and tokenizer, :func:`tiny_model` wraps them as a heedful :class:`~heedful.Model`.
:mod:`heedful.testing` (the conformance kit) gives them to users under the same names."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers as tf
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from heedful.loading import from_pretrained_objects
from heedful.model import Model

CORPUS = [
    "a charming and often affecting journey",
    "the movie was dull and far too long",
    "an intelligent , funny and moving film",
    "the sister of the doctors writes a letter",
    "the government alarms itself every year",
    "this mall is closed but these malls are open",
    "the plot is predictable yet the actors are wonderful",
    "what a waste of a talented cast",
    "the capital of france is paris",
    "we watched it twice and loved every minute",
] * 3
"""The sentences the tiny tokenizers are built from."""

INIT_RANGE = 0.2
"""Weight scale of :func:`conformance_model`. With transformers' default (0.02) the encoders'
logits are ~1e-3 and nearly input-independent, so comparisons at 1e-5 would prove little; at
0.2 logits are O(1) and predictions vary between texts."""


def _wordpiece_vocab() -> dict[str, int]:
    """A fixed WordPiece vocabulary built from ``CORPUS``: specials, every character (alone and as
    ``##`` continuation), corpus words of up to 8 letters whole, longer ones split before their
    last 3 letters ("affecting" -> "affect" "##ing"); unseen words fall back to characters.

    Not trained: ``tokenizers``' WordPieceTrainer breaks frequency ties in hash-map order, which
    changes from process to process, and so did the tiny encoders' token ids and outputs.
    """
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = sorted({w for line in CORPUS for w in line.lower().split()})
    chars = sorted({c for w in words for c in w})
    pieces: list[str] = []
    for w in words:
        pieces.extend([w] if len(w) <= 8 else [w[:-3], "##" + w[-3:]])
    ordered = specials + chars + ["##" + c for c in chars] + pieces
    return {tok: i for i, tok in enumerate(dict.fromkeys(ordered))}


def _templated(tok: Tokenizer, cls: str, sep: str, pair: str, **special: str) -> tf.PreTrainedTokenizerFast:
    """``tok`` wrapping texts as ``cls text sep`` (pairs: the template ``pair``), as a fast
    tokenizer with ``cls`` / ``sep`` and the ``special`` tokens named."""
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=pair,
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, cls_token=cls, sep_token=sep, model_max_length=64, **special)


@functools.cache
def wordpiece_tokenizer() -> tf.PreTrainedTokenizerFast:
    """BERT-style: [CLS] text [SEP] (pairs: [CLS] a [SEP] b [SEP]), lower-cased WordPiece."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.model = models.WordPiece(_wordpiece_vocab(), unk_token="[UNK]")
    tok.decoder = decoders.WordPiece()
    return _templated(
        tok, "[CLS]", "[SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]"
    )


@functools.cache
def bytelevel_tokenizer(with_mask: bool = False) -> tf.PreTrainedTokenizerFast:
    """GPT-2 / RoBERTa-style byte-level BPE. ``with_mask`` adds <s> </s> <mask> and a RoBERTa template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"] if with_mask else ["<|endoftext|>"]
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    if with_mask:
        named = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
        return _templated(tok, "<s>", "</s>", "<s> $A </s> </s> $B </s>", **named)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=64
    )


@dataclass(frozen=True)
class TinyFamily:
    """How to build a tiny model of one family: its ``transformers`` ``config`` class name, the
    configuration ``kwargs``, its ``tokenizer`` (``"wordpiece"``, ``"bytelevel"`` or, with
    ``<mask>`` and a RoBERTa template, ``"bytelevel_mask"``), the config keys set to the
    tokenizer's padding id (``pad``) and to its ``[CLS]`` / ``[SEP]`` / ``[MASK]`` ids
    (``specials``), whether it is an ``encoder`` (masked LM) or a decoder (causal LM), and the
    name of the config's weight-scale option (``init``)."""

    config: str
    kwargs: Mapping[str, Any]
    tokenizer: str = "bytelevel"
    encoder: bool = False
    pad: tuple[str, ...] = ("pad_token_id", "bos_token_id", "eos_token_id")
    specials: bool = False
    init: str = "initializer_range"


_SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "hidden_size": 32, "max_position_embeddings": 64}
_GQA = {**_SMALL, "num_key_value_heads": 2, "head_dim": 8}

TINY_FAMILIES: dict[str, TinyFamily] = {
    "bert": TinyFamily("BertConfig", _SMALL, "wordpiece", encoder=True, pad=("pad_token_id",)),
    "distilbert": TinyFamily(
        "DistilBertConfig", {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 64},
        "wordpiece", encoder=True, pad=("pad_token_id",),
    ),
    "roberta": TinyFamily("RobertaConfig", {**_SMALL, "max_position_embeddings": 66, "type_vocab_size": 1}, "bytelevel_mask", encoder=True, pad=("pad_token_id",)),
    "deberta-v2": TinyFamily("DebertaV2Config", _SMALL, "wordpiece", encoder=True, pad=("pad_token_id",)),
    "electra": TinyFamily("ElectraConfig", {**_SMALL, "embedding_size": 16}, "wordpiece", encoder=True, pad=("pad_token_id",)),
    "gpt2": TinyFamily("GPT2Config", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    "opt": TinyFamily(
        "OPTConfig", {**_SMALL, "ffn_dim": 64, "word_embed_proj_dim": 32}, init="init_std",
    ),
    "llama": TinyFamily("LlamaConfig", _SMALL),
    "qwen2": TinyFamily("Qwen2Config", {**_SMALL, "num_key_value_heads": 2}),
    "mistral": TinyFamily("MistralConfig", {**_SMALL, "num_key_value_heads": 2}),
    # families whose blocks add to a plain block (heedful.adapters.recent)
    "qwen3": TinyFamily("Qwen3Config", _GQA),
    "qwen3_moe": TinyFamily(
        "Qwen3MoeConfig",
        {**_GQA, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": [1]},
    ),
    "mixtral": TinyFamily("MixtralConfig", {**_GQA, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "gemma": TinyFamily("GemmaConfig", _GQA),
    # soft-capping at 5 (Gemma 2 ships 50 and 30) bends the tiny models' scores and logits
    "gemma2": TinyFamily(
        "Gemma2Config",
        {**_GQA, "query_pre_attn_scalar": 8, "sliding_window": 4, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 5.0},
    ),
    "gemma3_text": TinyFamily(
        "Gemma3TextConfig",
        {**_GQA, "query_pre_attn_scalar": 8, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3": TinyFamily("Phi3Config", {**_SMALL, "num_key_value_heads": 2}),
    "olmo2": TinyFamily("Olmo2Config", {**_SMALL, "num_key_value_heads": 2}),
    "gpt_neox": TinyFamily(
        "GPTNeoXConfig",
        {**_SMALL, "use_parallel_residual": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    ),
    "phi": TinyFamily("PhiConfig", {**_SMALL, "partial_rotary_factor": 0.5, "qk_layernorm": True}),
    # rotary positions on half of each 8-wide head, as GPT-J-6B rotates 64 of 256
    "gptj": TinyFamily("GPTJConfig", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 64, "n_positions": 64, "rotary_dim": 4}),
    "smollm3": TinyFamily("SmolLM3Config", {**_SMALL, "num_key_value_heads": 2, "no_rope_layer_interval": 2}),
    "stablelm": TinyFamily(
        "StableLmConfig",
        {**_SMALL, "num_key_value_heads": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    ),
    "glm": TinyFamily("GlmConfig", {**_GQA, "partial_rotary_factor": 0.5}),
    "modernbert": TinyFamily(
        "ModernBertConfig",
        {**_SMALL, "num_hidden_layers": 3, "global_attn_every_n_layers": 2, "local_attention": 4, "layer_types": None},
        "wordpiece", encoder=True, pad=("pad_token_id",), specials=True,
    ),
}
"""The tiny configuration of every family heedful maps, as data (``config.model_type`` ->
:class:`TinyFamily`): 2 blocks (ModernBERT: 3, to have a global and a local block after its
first) of 4 heads, width 32. :func:`tiny_hf` builds them; ``check_family`` checks them."""

ENCODERS = ("bert", "distilbert", "roberta", "deberta-v2", "electra")
DECODERS = ("gpt2", "opt", "llama", "qwen2", "mistral")
MODEL_FAMILIES = ENCODERS + DECODERS
"""The families every method's tests run on (:func:`check_method`'s cases)."""
ALL_FAMILIES = tuple(TINY_FAMILIES)
"""Every family with a tiny model (:data:`TINY_FAMILIES`)."""


def _config(family: str, vocab: int, tokenizer) -> tf.PretrainedConfig:
    spec = TINY_FAMILIES.get(family)
    if spec is None:
        raise ValueError(f"no tiny model of family {family!r} (one of {', '.join(TINY_FAMILIES)})")
    ids = dict.fromkeys(spec.pad, tokenizer.pad_token_id)
    if spec.specials:
        ids.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    return getattr(tf, spec.config)(vocab_size=vocab, **spec.kwargs, **ids)


def tokenizer_for(family: str) -> tf.PreTrainedTokenizerFast:
    """The tiny tokenizer of a model family (WordPiece for BERT-likes, byte-level BPE otherwise)."""
    kind = TINY_FAMILIES[family].tokenizer if family in TINY_FAMILIES else "bytelevel"
    if kind == "wordpiece":
        return wordpiece_tokenizer()
    return bytelevel_tokenizer(with_mask=kind == "bytelevel_mask")


_AUTO = {
    "classification": tf.AutoModelForSequenceClassification,
    "regression": tf.AutoModelForSequenceClassification,
    "masked_lm": tf.AutoModelForMaskedLM,
    "causal_lm": tf.AutoModelForCausalLM,
}


def tasks_of(family: str) -> tuple[str, ...]:
    """The tasks a tiny model of ``family`` has a head for (encoders: masked LM; decoders: causal LM)."""
    return ("classification", "regression", "masked_lm" if TINY_FAMILIES[family].encoder else "causal_lm")


def tiny_hf(family: str, task: str = "classification", seed: int = 0, **config_overrides):
    """``(hf_model, tokenizer)`` for a tiny seeded model of ``family`` with the head for ``task``
    (2 layers of 4 heads, hidden size 32).

    ``config_overrides`` set config attributes before the weights are drawn (e.g.
    ``initializer_range=0.2`` for larger, less uniform outputs).
    """
    tokenizer = tokenizer_for(family)
    config = _config(family, len(tokenizer), tokenizer)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    if task == "classification":
        config.num_labels = 3
        config.id2label = {0: "NEGATIVE", 1: "NEUTRAL", 2: "POSITIVE"}
        config.label2id = {v: k for k, v in config.id2label.items()}
    elif task == "regression":
        config.num_labels = 1
        config.problem_type = "regression"
    torch.manual_seed(seed)
    model = _AUTO[task].from_config(config, attn_implementation="eager")
    model.eval()
    return model, tokenizer


def tiny_model(family: str, task: str = "classification", seed: int = 0, **config_overrides) -> Model:
    """A heedful :class:`~heedful.Model` around :func:`tiny_hf`.

    >>> tiny_model("bert", "masked_lm").task
    'masked_lm'
    """
    hf_model, tokenizer = tiny_hf(family, task, seed, **config_overrides)
    return from_pretrained_objects(hf_model, tokenizer, name=f"tiny-{family}-{task}")


@functools.cache
def conformance_model(family: str, task: str = "classification") -> Model:
    """The tiny model :func:`check_method` uses: :func:`tiny_model` with weights drawn at
    :data:`INIT_RANGE`, built once per process (do not change its weights)."""
    scale = {TINY_FAMILIES[family].init: INIT_RANGE}
    return tiny_model(family, task, **scale)


# =========================================================================== fast options


def random_head_mask(model: Model, seed: int = 0) -> list[list[int]]:
    """A seeded random 0/1 head mask ``[L, H]`` of ``model``'s shape, every layer keeping at
    least one head (Mask-LRP's default mask would parse a whole dataset first)."""
    gen = np.random.default_rng(seed)
    shape = (model.adapter.num_layers, model.adapter.config.num_attention_heads)
    mask = gen.integers(0, 2, size=shape)
    mask[np.arange(shape[0]), gen.integers(0, shape[1], size=shape[0])] = 1
    return mask.tolist()
