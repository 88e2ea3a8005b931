"""Adapters against the transformers models they wrap: logits, tokens, word grouping, and clear
failures for architectures and heads heedful does not know."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from conftest import cached_model
from tiny import DECODERS, ENCODERS, FAMILIES, tiny_hf

import heedful
from heedful.adapters import GenericAdapter, adapter_for

TEXTS = ["a charming and often affecting journey", "the movie was dull"]

CASES = (
    [(f, "classification") for f in FAMILIES]
    + [(f, "regression") for f in FAMILIES]
    + [(f, "masked_lm") for f in ENCODERS]
    + [(f, "causal_lm") for f in DECODERS]
)


def texts_for(model, task: str) -> list[str]:
    if task != "masked_lm":
        return TEXTS
    mask = model.tokenizer.mask_token
    return [f"a charming and often {mask} journey", f"the {mask} was dull"]


@pytest.mark.parametrize(("family", "task"), CASES)
def test_forward_logits_equal_hf_on_padded_batch(family, task):
    model = cached_model(family, task)
    hf, tok = model.hf_model, model.tokenizer
    texts = texts_for(model, task)
    problem = model.prepare(texts)
    batch, anchor, ours = problem.batch, problem.anchor, problem.reference.logits
    assert batch.attention_mask[1].sum() < batch.attention_mask[0].sum(), "the batch must be padded"
    with torch.no_grad():
        enc = tok(texts, padding=True, return_tensors="pt", padding_side="right")
        theirs = hf(**enc).logits
    if task in ("masked_lm", "causal_lm"):
        if task == "masked_lm":
            expected = (enc["input_ids"] == tok.mask_token_id).int().argmax(dim=1)
        else:
            expected = enc["attention_mask"].sum(dim=1) - 1
        assert anchor.tolist() == expected.tolist()
        theirs = theirs[torch.arange(len(texts)), expected]
    # HF pools [CLS] for encoders and the last non-pad token for decoders by itself
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the two texts must give different outputs, or the comparison proves little
    assert (ours[0] - ours[1]).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_tokens_are_the_tokenizers(family):
    model = cached_model(family)
    tok = model.tokenizer
    texts = ["unbelievably charming , often affecting", "the movie was dull"]
    batch = model.adapter.encode(texts)
    for b, text in enumerate(texts):
        enc = tok(text, return_special_tokens_mask=True)
        assert batch.tokens[b] == tok.convert_ids_to_tokens(enc["input_ids"])
        n = len(enc["input_ids"])
        assert int(batch.lengths[b]) == n
        assert batch.input_ids[b, :n].tolist() == enc["input_ids"]
        assert batch.special_mask[b, :n].tolist() == [bool(s) for s in enc["special_tokens_mask"]]
        assert not batch.special_mask[b, n:].any(), "padding is not flagged as a special token"
        for i, special in enumerate(batch.special_mask[b, :n].tolist()):
            assert (batch.offsets[b][i] is None) == special
            assert (batch.word_ids[b][i] is None) == special
    if family in ENCODERS:
        cls, sep = tok.cls_token, tok.sep_token
        assert batch.tokens[0][0] == cls and batch.tokens[0][-1] == sep
        assert batch.special_mask[0, 0] and batch.special_mask[0, len(batch.tokens[0]) - 1]
    else:
        assert not batch.special_mask.any()


@pytest.mark.parametrize("family", FAMILIES)
def test_word_ids_group_subwords(family):
    model = cached_model(family)
    tok = model.tokenizer
    text = "unbelievably charming , often affecting"
    batch = model.adapter.encode([text])
    words, offsets = batch.word_ids[0], batch.offsets[0]
    enc = tok(text)
    hf_words = enc.word_ids()
    content = [i for i, w in enumerate(words) if w is not None]
    # same grouping as the tokenizer's own word ids, renumbered 0, 1, 2, ...
    for i in content:
        for j in content:
            assert (words[i] == words[j]) == (hf_words[i] == hf_words[j])
    assert sorted(set(words[i] for i in content)) == list(range(len(set(hf_words) - {None})))
    # a word split into several sub-words: consecutive tokens, spans covering the word
    first_word = [i for i in content if words[i] == words[content[0]]]
    assert len(first_word) > 1, "'unbelievably' should split into sub-words in the tiny vocabularies"
    assert first_word == list(range(first_word[0], first_word[-1] + 1))
    start, end = offsets[first_word[0]][0], offsets[first_word[-1]][1]
    assert text[start:end].strip() == "unbelievably"
    for i in content:  # spans lie in the text (byte-level BPE may give a bare space an empty span)
        s, e = offsets[i]
        assert 0 <= s <= e <= len(text)
        piece = batch.tokens[0][i].replace("##", "").replace("\u0120", " ")  # \u0120 = byte-level space
        assert text[s:e].strip() == piece.strip() or text[s:e] == ""


def test_word_ids_of_a_text_pair_do_not_collide():
    model = cached_model("bert")
    batch = model.adapter.encode(["great acting"], ["a dull plot"])
    words, segments = batch.word_ids[0], batch.sequence_ids[0]
    first = {w for w, s in zip(words, segments, strict=True) if s == 0 and w is not None}
    second = {w for w, s in zip(words, segments, strict=True) if s == 1 and w is not None}
    assert first and second and not first & second
    assert batch.token_type_ids is not None and batch.token_type_ids[0].max() == 1
    # the second segment's type ids reach the model
    enc = model.tokenizer("great acting", "a dull plot", return_token_type_ids=True, return_tensors="pt")
    ours = model.prepare(batch).reference.logits
    with torch.no_grad():
        theirs = model.hf_model(**enc).logits
        untyped = model.hf_model(input_ids=enc["input_ids"]).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (theirs - untyped).abs().max() > 1e-4


def test_bare_model_without_head_is_rejected():
    hf, tok = tiny_hf("bert")
    bare = hf.bert  # a BertModel: no classification or LM head
    with pytest.raises(heedful.UnsupportedModelError) as info:
        adapter_for(bare, tok)
    err = info.value
    assert "BertModel" in err.message and "head" in err.message
    assert err.hint and "ForSequenceClassification" in err.hint


def test_unmapped_architecture_gets_the_generic_adapter():
    tok = tiny_hf("bert")[1]
    config = tf.AlbertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, embedding_size=16, num_labels=2,
    )
    adapter = adapter_for(tf.AlbertForSequenceClassification(config), tok)
    assert isinstance(adapter, GenericAdapter) and "albert" in adapter.described


def test_head_module_missing_is_rejected():
    hf, tok = tiny_hf("roberta")
    del hf.classifier
    with pytest.raises(heedful.UnsupportedModelError) as info:
        adapter_for(hf, tok)
    assert "classification head" in info.value.message and info.value.hint


def test_task_that_needs_another_head_is_rejected():
    hf, tok = tiny_hf("bert", "classification")
    with pytest.raises(heedful.UnsupportedModelError) as info:
        adapter_for(hf, tok, task="masked_lm")
    assert "masked_lm" in info.value.message and "classification" in info.value.hint
    # classification and regression share a head: allowed
    assert adapter_for(hf, tok, task="regression").task == "regression"


def test_load_rejects_unsupported_and_headless_checkpoints(tmp_path):
    tf.AlbertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path / "albert")
    with pytest.raises(heedful.UnsupportedModelError, match="no head heedful can explain"):
        heedful.load(tmp_path / "albert")
    bare = tiny_hf("bert")[0].bert
    bare.config.architectures = ["BertModel"]
    bare.config.save_pretrained(tmp_path / "bare")
    with pytest.raises(heedful.UnsupportedModelError, match="BertModel") as info:
        heedful.load(tmp_path / "bare")
    assert info.value.hint


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("gpt2", "regression")])
def test_task_is_inferred_from_the_head(family, task):
    hf, tok = tiny_hf(family, task)
    assert heedful.from_pretrained_objects(hf, tok).task == task


def test_removal_and_max_length():
    assert cached_model("bert").adapter.removal_token_id == cached_model("bert").tokenizer.mask_token_id
    assert cached_model("gpt2").adapter.removal_token_id is None  # causal LMs delete
    # RoBERTa: 66 position embeddings hold 64 tokens (two reserved for the padding offset)
    assert cached_model("roberta").adapter.max_length == 64
    assert cached_model("bert").adapter.max_length == 64


@pytest.mark.parametrize(("q", "k"), [(5, 9), (7, 7), (1, 6)])
def test_causal_attention_aligns_its_queries_to_the_last_keys(q, k):
    from heedful.adapters.causal import causal_attention

    gen = torch.Generator().manual_seed(q * 10 + k)
    batch, heads, groups, dim = 2, 4, 2, 8
    query = torch.randn(batch, heads, q, dim, generator=gen)
    key = torch.randn(batch, heads // groups, k, dim, generator=gen)
    value = torch.randn(batch, heads // groups, k, dim, generator=gen)
    got, probs = causal_attention(torch.nn.Module().eval(), query, key, value, None, scaling=0.3)
    assert probs is None and got.shape == (batch, q, heads, dim)
    for b in range(batch):
        for h in range(heads):
            kv = h // groups
            for i in range(q):
                seen = k - q + i + 1  # query i sits at position k - q + i
                weights = torch.softmax(0.3 * key[b, kv, :seen] @ query[b, h, i], dim=0)
                expected = weights @ value[b, kv, :seen]
                torch.testing.assert_close(got[b, i, h], expected, atol=1e-5, rtol=1e-5)
