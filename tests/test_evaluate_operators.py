"""Cross-operator evaluation: the deletion / comprehensiveness and sufficiency curves under each
removal operator equal a plain loop over examples and ratios on tiny seeded models."""

from __future__ import annotations

import dataclasses
import re
import zlib

import numpy as np
import pytest
import torch

from heedful.errors import InputError
from heedful.evaluate import evaluate, get_protocol, operators

TEXTS = [
    "a charming and often affecting journey",
    "the movie was dull and far too long",
    "what a waste of a talented cast",
]
CORPUS = ["a dull and tedious film", "the cast was wonderful", "a long and charming movie", "we loved it"]
TAGS = {"a": "DET", "the": "DET", "and": "CCONJ", "was": "AUX", "we": "PRON", "it": "PRON", "of": "ADP",
        "often": "ADV", "far": "ADV", "too": "ADV", "what": "PRON", "loved": "VERB", "affecting": "ADJ"}
ADJECTIVES = {"charming", "dull", "tedious", "wonderful", "long", "talented"}


def _words(texts):
    """A dictionary tagger: every word its listed tag, ADJ for the adjectives, NOUN otherwise."""
    return [[(m.start(), m.end(), TAGS.get(m.group(), "ADJ" if m.group() in ADJECTIVES else "NOUN"))
             for m in re.finditer(r"\w+", t)] for t in texts]


@pytest.fixture
def dictionary_tagger(monkeypatch):
    monkeypatch.setattr(operators, "corpus_texts", lambda: list(CORPUS))
    operators.use_tagger(_words)
    yield
    operators.use_tagger(None)


def _with_scores(expls, seed=0):
    rng = np.random.default_rng(seed)
    return [dataclasses.replace(e, scores=rng.normal(size=len(e.tokens))) for e in expls]


@torch.no_grad()
def _prob(model, ids: list[int], label: int) -> float:
    logits = model.hf_model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    return float(torch.softmax(logits[0].float(), dim=-1).double()[label])


def _pool_by_hand(tokenizer) -> dict[str, list[int]]:
    """Corpus words by tag, kept when one token of the vocabulary (with a leading space first)."""
    pool: dict[str, set[int]] = {}
    for text, words in zip(CORPUS, _words(CORPUS), strict=True):
        for start, end, tag in words:
            for variant in (" " + text[start:end], text[start:end]):
                ids = tokenizer(variant, add_special_tokens=False)["input_ids"]
                if len(ids) == 1 and ids[0] != tokenizer.unk_token_id and ids[0] not in tokenizer.all_special_ids:
                    pool.setdefault(tag, set()).add(ids[0])
    every = sorted(set().union(*pool.values()))
    return {**{tag: sorted(ids) for tag, ids in pool.items()}, "*": every}


def _replacement_by_hand(model, text: str, enc, i: int) -> int:
    """The sample operator's word for position ``i``: a corpus word of the tag of the word holding
    the token's first character, drawn with the position's uniform (seeded with the text's CRC-32)."""
    pool = _pool_by_hand(model.tokenizer)
    start = enc["offset_mapping"][i][0]
    tag = next(tag for s, e, tag in _words([text])[0] if s <= start < e)
    width = max(model.adapter.max_length, len(enc["input_ids"]))
    seed = zlib.crc32(text.encode("utf-8"))
    u = float(torch.rand(width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)[i])
    candidates = pool.get(tag, pool["*"])
    return candidates[min(int(u * len(candidates)), len(candidates) - 1)]


def _curves_by_hand(model, text: str, scores: np.ndarray, operator: str) -> tuple[np.ndarray, np.ndarray]:
    """Comprehensiveness and sufficiency curves of one text, one ratio at a time: the content
    tokens ranked by score; the top floor(n k) removed (or all but them) by ``operator``."""
    enc = model.tokenizer(text, return_special_tokens_mask=True, return_offsets_mapping=True)
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    content = [i for i in range(len(ids)) if not special[i]]
    ranking = sorted(content, key=lambda i: (-scores[i], i))
    label = int(np.argmax([_prob(model, ids, c) for c in range(2)]))
    p0 = _prob(model, ids, label)

    def removed(positions) -> list[int]:
        if operator == "delete":
            return [t for i, t in enumerate(ids) if i not in positions]
        if operator == "sample":
            return [_replacement_by_hand(model, text, enc, i) if i in positions else t for i, t in enumerate(ids)]
        token = model.tokenizer.mask_token_id if operator == "mask" else model.tokenizer.unk_token_id
        return [token if i in positions else t for i, t in enumerate(ids)]

    comp, suff = [], []
    for k in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        top = set(ranking[: int(len(content) * k)])
        comp.append(p0 - _prob(model, removed(top), label) if top else 0.0)
        rest = set(content) - top
        suff.append(p0 - _prob(model, removed(rest), label) if rest else 0.0)
    return np.array(comp), np.array(suff)


@pytest.mark.parametrize("operator", ["delete", "mask", "unk", "sample"])
def test_each_operators_curves_equal_a_plain_loop(tiny, dictionary_tagger, operator):
    model = tiny("bert")
    expls = _with_scores(model.explain(TEXTS, "saliency"))
    protocol = get_protocol("default", specials="exclude", ratios=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                            mean_over=None, count_base="rankable", removal=operator)
    result = evaluate(model, expls, ["aopc", "sufficiency"], protocol, batch_size=2)
    for b, (text, e) in enumerate(zip(TEXTS, expls, strict=True)):
        comp, suff = _curves_by_hand(model, text, np.asarray(e.scores), operator)
        np.testing.assert_allclose(np.nan_to_num(result["aopc"].per_example.curves[b]), comp, atol=2e-6)
        np.testing.assert_allclose(np.nan_to_num(result["sufficiency"].per_example.curves[b]), suff, atol=2e-6)


def test_the_sample_operator_draws_words_of_the_same_part_of_speech(tiny, dictionary_tagger):
    model = tiny("bert")
    batch = model.adapter.encode(["the movie was dull"], None, True, None)
    replaced = operators.sampled_replacements(model.adapter, batch)[0]
    pool = _pool_by_hand(model.tokenizer)
    words = ["[CLS]", "the", "movie", "was", "dull", "[SEP]"]
    assert batch.tokens[0] == words  # one token per word in the tiny vocabulary
    assert int(replaced[0]) == int(batch.input_ids[0, 0]) and int(replaced[-1]) == int(batch.input_ids[0, -1])
    for i, tag in ((1, "DET"), (3, "AUX"), (4, "ADJ")):
        assert int(replaced[i]) in pool[tag]
    # the draw is the example's own: measured alone or beside a longer text, the same words
    longer = model.adapter.encode(["the movie was dull", TEXTS[0] + " " + TEXTS[1]], None, True, None)
    assert operators.sampled_replacements(model.adapter, longer)[0, :6].tolist() == replaced.tolist()


def test_an_unknown_operator_is_refused_in_one_line():
    with pytest.raises(InputError, match="removal='shuffle' is not one of"):
        get_protocol("default", removal="shuffle")


def test_bench_takes_the_operator_and_refuses_an_unknown_one_before_loading(monkeypatch, capsys):
    from conftest import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "bench", "--model", "no-such-model", "--dataset", "movies",
                           "--methods", "random", "--operator", "shuffle")
    assert code == 2
    assert "removal='shuffle' is not one of auto, mask, pad, unk, delete, sample" in " ".join(err.split())
