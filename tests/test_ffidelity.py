"""F-Fidelity (Zheng et al. 2024): the fine-tuning with random removal runs and removes what it
says, and FFid+ / FFid- equal a plain loop over draws on the fine-tuned copy, not the original."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heedful.errors import InputError
from heedful.evaluate import get_protocol
from heedful.evaluate.ffidelity import FFID_SEED, f_fidelity
from heedful.loading import from_pretrained_objects
from heedful.tiny_models import tiny_hf
from heedful.zoo.train import RemovalTrainConfig, fine_tune, randomly_removed

TEXTS = [
    "a charming and often affecting journey",
    "the movie was dull and far too long",
    "what a waste of a talented cast",
]
TRAIN = [t for t in TEXTS for _ in range(4)]
LABELS = np.array([2, 0, 0] * 4)


def test_random_removal_masks_a_bounded_share_of_content_tokens_only():
    _, tokenizer = tiny_hf("bert")
    enc = tokenizer(TRAIN, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask")
    out = randomly_removed(dict(enc), special, 0.5, tokenizer.mask_token_id, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    masked = out["input_ids"] == tokenizer.mask_token_id
    content = enc["attention_mask"].bool() & ~special.bool()
    assert not (masked & ~content).any()  # [CLS], [SEP] and padding untouched
    assert (masked.sum(dim=1) <= torch.floor(0.5 * content.sum(dim=1))).all()
    assert masked.any()  # twelve texts: some lose tokens
    deleted = randomly_removed(dict(enc), special, 0.5, None, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    assert torch.equal(deleted["attention_mask"].sum(dim=1), enc["attention_mask"].sum(dim=1) - masked.sum(dim=1))


WIDE = {"initializer_range": 0.2}  # outputs that move when tokens are masked


def _finetuned():
    hf, tokenizer = tiny_hf("bert", **WIDE)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    summary = fine_tune(hf, tokenizer, TRAIN, LABELS, RemovalTrainConfig(batch_size=4, learning_rate=1e-3, threads=1), progress=False)
    assert summary["steps"] == 3
    assert any(not torch.equal(before[k], v) for k, v in hf.state_dict().items())
    return from_pretrained_objects(hf, tokenizer, name="tiny-bert-ffidelity")


@torch.no_grad()
def _prob(model, ids, label):
    logits = model.hf_model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    return float(torch.softmax(logits[0].float(), -1).double()[label])


def _ffid_by_hand(model, text, scores, label, beta, samples):
    """Eq. 5-6 one draw at a time: content tokens ranked by score; at each tenth alpha, S subsets
    of at most floor(beta n) of the top floor(alpha n) (FFid+) or of the rest (FFid-), each the
    candidates with the smallest of the draw's seeded keys, masked; the drops averaged."""
    enc = model.tokenizer(text, return_special_tokens_mask=True)
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    content = [i for i in range(len(ids)) if not special[i]]
    ranking = sorted(content, key=lambda i: (-scores[i], i))
    width = max(model.adapter.max_length, len(ids))
    keys = torch.rand(samples, width, generator=torch.Generator().manual_seed(FFID_SEED), dtype=torch.float64)
    p0 = _prob(model, ids, label)
    budget = int(np.floor(len(content) * beta))
    plus, minus = [], []
    for alpha in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        top = ranking[: int(len(content) * alpha)]
        rest = [i for i in content if i not in top]
        for out, pool in ((plus, top), (minus, rest)):
            drops = []
            for s in range(samples):
                chosen = sorted(pool, key=lambda i: (float(keys[s, i]), i))[:budget]
                masked = [model.tokenizer.mask_token_id if i in chosen else t for i, t in enumerate(ids)]
                drops.append(p0 - _prob(model, masked, label) if chosen else 0.0)
            out.append(np.mean(drops))
    return np.mean(plus), np.mean(minus)


def test_ffidelity_measures_the_finetuned_copy_as_a_plain_loop():
    original = from_pretrained_objects(*tiny_hf("bert", **WIDE), name="tiny-bert")
    finetuned = _finetuned()
    rng = np.random.default_rng(0)
    expls = [dataclasses.replace(e, scores=rng.normal(size=len(e.tokens))) for e in original.explain(TEXTS, "saliency")]
    protocol = get_protocol("default", removal="mask", specials="exclude", ratios=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), mean_over=None, count_base="rankable")
    found = f_fidelity(finetuned, expls, protocol, beta=0.5, samples=3, batch_size=2)
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        plus, minus = _ffid_by_hand(finetuned, text, np.asarray(e.scores), e.target.indices[0], 0.5, 3)
        assert found.plus.values[b] == pytest.approx(plus, abs=2e-6)
        assert found.minus.values[b] == pytest.approx(minus, abs=2e-6)
    assert np.abs(found.plus.values).max() > 1e-3  # the copy's outputs move: the check is not vacuous
    on_original = f_fidelity(original, expls, protocol, beta=0.5, samples=3)
    assert not np.allclose(on_original.plus.values, found.plus.values)
    assert found.plus_summary.n == 3 and found.plus_summary.has_interval


def test_ffidelity_refuses_bad_settings_in_one_line(tiny):
    model = tiny("bert")
    expls = model.explain(TEXTS[:1], "saliency")
    with pytest.raises(InputError, match="beta must lie in"):
        f_fidelity(model, expls, beta=0.0)
    with pytest.raises(InputError, match="F-Fidelity is defined for classifiers"):
        f_fidelity(tiny("bert", "regression"), expls)


def test_a_decoder_classifier_trains_on_unk_replacement_and_reads_each_rows_last_token():
    """smollm2-sentiment's copy is trained this way: a right-padded decoder classifier whose
    tokenizer's [UNK] is not its padding token. Each removed row, padded in the batch, gives the
    logits it gives alone (the head reads its last real token, whatever was replaced); training
    on such batches moves the weights."""
    hf, tokenizer = tiny_hf("llama", **WIDE)
    tokenizer.unk_token = tokenizer.convert_ids_to_tokens(5)  # the tiny tokenizer has none; any id but padding's
    assert tokenizer.unk_token_id != tokenizer.pad_token_id and tokenizer.padding_side == "right"
    enc = tokenizer(TRAIN, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask")
    removed = randomly_removed(dict(enc), special, 0.5, tokenizer.unk_token_id, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    replaced = removed["input_ids"] == tokenizer.unk_token_id
    assert replaced.any() and (replaced & removed["attention_mask"].bool()).sum() == replaced.sum()
    with torch.no_grad():
        batched = hf(**removed).logits
        for b in range(len(TRAIN)):
            n = int(removed["attention_mask"][b].sum())
            alone = hf(input_ids=removed["input_ids"][b : b + 1, :n]).logits[0]
            assert torch.allclose(batched[b], alone, atol=1e-5)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    config = RemovalTrainConfig(batch_size=4, learning_rate=1e-3, threads=1, removal="unk")
    assert fine_tune(hf, tokenizer, TRAIN, LABELS, config, progress=False)["steps"] == 3
    assert any(not torch.equal(before[k], v) for k, v in hf.state_dict().items())
