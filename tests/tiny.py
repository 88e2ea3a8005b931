"""Tiny, randomly initialised models of every supported family, with real fast tokenizers
trained in memory on a small corpus. Seeded: the same call gives the same weights."""

from __future__ import annotations

import functools

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

import heedful

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

ENCODERS = ("bert", "distilbert", "roberta", "deberta-v2", "electra")
DECODERS = ("gpt2", "opt", "llama", "qwen2", "mistral")
FAMILIES = ENCODERS + DECODERS


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


@functools.cache
def wordpiece_tokenizer() -> tf.PreTrainedTokenizerFast:
    """BERT-style: [CLS] text [SEP] (pairs: [CLS] a [SEP] b [SEP]), lower-cased WordPiece."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.model = models.WordPiece(_wordpiece_vocab(), unk_token="[UNK]")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece()
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
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
        trainers.BpeTrainer(vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    if with_mask:
        bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", bos), ("</s>", eos)],
        )
        return tf.PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            cls_token="<s>",
            sep_token="</s>",
            mask_token="<mask>",
            model_max_length=64,
        )
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=64
    )


def _config(family: str, vocab: int, pad: int) -> tf.PretrainedConfig:
    small = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "hidden_size": 32}
    if family == "bert":
        return tf.BertConfig(vocab_size=vocab, max_position_embeddings=64, pad_token_id=pad, **small)
    if family == "distilbert":
        return tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, pad_token_id=pad)
    if family == "roberta":
        return tf.RobertaConfig(vocab_size=vocab, max_position_embeddings=66, pad_token_id=pad, type_vocab_size=1, **small)
    if family == "deberta-v2":
        return tf.DebertaV2Config(vocab_size=vocab, max_position_embeddings=64, pad_token_id=pad, **small)
    if family == "electra":
        return tf.ElectraConfig(vocab_size=vocab, embedding_size=16, max_position_embeddings=64, pad_token_id=pad, **small)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=pad, bos_token_id=pad, eos_token_id=pad)
    if family == "opt":
        return tf.OPTConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=pad, bos_token_id=pad, eos_token_id=pad)
    extra = {"num_key_value_heads": 2} if family in ("qwen2", "mistral") else {}
    cfg_cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[family]
    return cfg_cls(vocab_size=vocab, max_position_embeddings=64, pad_token_id=pad, bos_token_id=pad, eos_token_id=pad, **small, **extra)


def tokenizer_for(family: str) -> tf.PreTrainedTokenizerFast:
    if family in ("bert", "distilbert", "deberta-v2", "electra"):
        return wordpiece_tokenizer()
    return bytelevel_tokenizer(with_mask=family == "roberta")


_AUTO = {
    "classification": tf.AutoModelForSequenceClassification,
    "regression": tf.AutoModelForSequenceClassification,
    "masked_lm": tf.AutoModelForMaskedLM,
    "causal_lm": tf.AutoModelForCausalLM,
}


def tiny_hf(family: str, task: str = "classification", seed: int = 0, **config_overrides):
    """``(hf_model, tokenizer)`` for a tiny seeded model of ``family`` with the head for ``task``.

    ``config_overrides`` set config attributes before the weights are drawn (e.g.
    ``initializer_range=0.2`` for larger, less uniform outputs).
    """
    tokenizer = tokenizer_for(family)
    config = _config(family, len(tokenizer), tokenizer.pad_token_id)
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


def tiny_model(family: str, task: str = "classification", seed: int = 0, **config_overrides) -> heedful.Model:
    """A heedful :class:`Model` around :func:`tiny_hf`."""
    hf_model, tokenizer = tiny_hf(family, task, seed, **config_overrides)
    return heedful.from_pretrained_objects(hf_model, tokenizer, name=f"tiny-{family}-{task}")
