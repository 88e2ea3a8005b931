"""The planted long-context set and the user's context JSON lines: the planted source holds the
answer and the question is no source, determinism, lengths counted with a tokenizer, bad input;
(slow) the zoo decoder answers the planted question."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import run_cli

from heedful import datasets
from heedful.datasets import planted
from heedful.datasets.context import load_context_file
from heedful.engine.sources import SourceSpec, split_text
from heedful.errors import InputError
from heedful.evaluate.context import example_sources


@pytest.fixture(scope="module")
def docs():
    return datasets.load("planted", "test", n=8, length=512)


def test_the_planted_source_holds_the_answer_and_the_question_is_no_source(docs):
    assert docs.task == "context" and len(docs) == 8
    for ex in docs:
        sources = [tuple(s) for s in ex.meta["sources"]]
        start, end = ex.meta["context"]
        assert start == 0 and ex.text[end:].startswith("\n\n")
        assert sources == sorted(sources) and all(a < b <= c for (a, b), (c, _) in zip(sources, sources[1:], strict=False))
        assert all(0 <= a < b <= end for a, b in sources)  # the question after the context is no source
        question = ex.text[end:].strip()
        subject, answer = ex.meta["subject"], ex.meta["answer"]
        assert question == f"The {subject} was" and ex.target == " " + answer
        a, b = sources[ex.meta["answer_source"]]
        assert ex.text[a:b] == f"The {subject} was {answer}."
        assert ex.evidence_spans == ((0, a, b),) and ex.evidence == (ex.text[a:b],)
        context = ex.text[:end]
        # exactly one sentence answers the question; the distractors rate other subjects otherwise
        assert len(re.findall(r"\b" + re.escape(subject) + r"\b", context, re.IGNORECASE)) == 1
        for other, rating in ex.meta["distractors"]:
            assert f"The {other} was {rating}." in context and rating != answer and other != subject
        assert ex.meta["tokens"] <= 512
        # the sources are the context's sentences as heedful.engine.sources cuts them
        assert split_text(ex.text, SourceSpec("sentences", within=(0, end))) == sources
        # the evaluation layer reads the same sources, answer and evidence
        assert example_sources(ex) == (tuple(sources), ex.meta["answer_source"], ((0, a, b),))
    places = [ex.meta["answer_source"] / len(ex.meta["sources"]) for ex in docs]
    assert len({round(p, 2) for p in places}) > 4  # seeded random places, not one fixed slot


def test_sentences_of_a_line_are_cut_as_every_text_is():
    from heedful.engine.sources import split_text

    def cut(line):
        return split_text(line, planted.SENTENCES)

    assert cut("It works. ... mostly! Yes") == [(0, 13), (14, 21), (22, 25)]
    assert cut("... a good look at war.") == [(0, 23)]
    assert cut("Plain text without an end") == [(0, 25)]
    assert cut('He said "Go." Then left.') == [(0, 13), (14, 24)]


def test_deterministic_for_a_seed_and_prefix_stable():
    a = datasets.load("planted", "test", n=4, length=256, seed=3)
    b = datasets.load("planted", "test", n=4, length=256, seed=3)
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    longer = datasets.load("planted", "test", n=6, length=256, seed=3)
    assert [e.to_dict() for e in longer][:4] == [e.to_dict() for e in a]
    other = datasets.load("planted", "test", n=4, length=256, seed=4)
    assert [e.text for e in other] != [e.text for e in a]
    # two lengths share the planted facts of each document
    long = datasets.load("planted", "test", n=4, length=1024, seed=3)
    assert [(e.meta["subject"], e.meta["answer"]) for e in long] == [(e.meta["subject"], e.meta["answer"]) for e in a]
    assert all(len(x.text) > 2 * len(y.text) for x, y in zip(long, a, strict=True))
    train = datasets.load("planted", "train", n=4, length=256, seed=3)
    assert [e.text for e in train] != [e.text for e in a]


def test_length_counted_with_a_tokenizer(tiny):
    tokenizer = tiny("llama", "causal_lm").adapter.tokenizer
    for length in (400, 600):  # the tiny tokenizer takes about a token per character
        data = datasets.load("planted", "test", n=3, length=length, tokenizer=tokenizer)
        for ex in data:
            counted = len(tokenizer(ex.text)["input_ids"])
            assert counted == ex.meta["tokens"] <= length
            assert counted > length - 250  # filled up to about the length (one snippet line short at most)
    with pytest.raises(InputError, match="length 200 cannot hold the planted sentences and the question"):
        datasets.load("planted", "test", n=1, length=200, tokenizer=tokenizer, distractors=10)
    estimated = datasets.load("planted", "test", n=3, length=300)
    for ex in estimated:
        assert ex.meta["tokens"] == int(np.ceil(len(ex.text) / planted.CHARS_PER_TOKEN)) <= 300


def test_answers_are_single_tokens_for_byte_level_bpe():
    from transformers import AutoTokenizer

    from heedful.files.cache import heedful_home

    folder = heedful_home() / "models" / "smollm2-135m"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("smollm2-135m is not built")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for word in planted.ANSWERS:
        assert len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1, word


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"length": 10}, "length must be a whole number of tokens of at least 128"),
        ({"length": "long"}, "length must be a whole number"),
        ({"distractors": 40}, "distractors must be a whole number from 0 to"),
        ({"seed": 1.5}, "seed must be a whole number"),
        ({"tokenizer": "smollm2"}, "tokenizer must be a tokenizer"),
        ({"lenght": 512}, "dataset 'planted' takes no option 'lenght'"),
    ],
)
def test_bad_planted_options(options, message):
    with pytest.raises(InputError, match=re.escape(message)):
        datasets.load("planted", "test", n=2, **options)


def test_bad_planted_split():
    with pytest.raises(InputError, match="unknown split 'dev' of the planted set"):
        datasets.load("planted", "dev", n=2)


def test_bench_refuses_an_unknown_dataset_option_before_loading_the_model(monkeypatch, capsys):
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", "no-such-model", "--dataset", "planted", "--methods", "saliency",
        "--option", "dataset.lenght=512",
    )
    assert code == 2 and "dataset 'planted' takes no option 'lenght'" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- the user's JSON lines
def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_context_jsonl_round_trip(tmp_path):
    rows = [
        {"context": "It rained. We sat in. The cat slept.", "query": "Who slept?", "target": " The cat", "answer_source": 2},
        {"context": "A dog ran. The sky was red.", "query": "Sky?", "answer_span": [15, 26], "id": "sky"},
        {"context": "One. Two.", "query": "Q"},
    ]
    data = datasets.load(_write(tmp_path / "ctx.jsonl", rows), split="all")
    assert data.task == "context" and [e.id for e in data] == ["0", "sky", "2"]
    first, second, third = data
    assert first.text == "It rained. We sat in. The cat slept.\n\nWho slept?" and first.target == " The cat"
    assert example_sources(first) == (((0, 10), (11, 21), (22, 36)), 2, ((0, 22, 36),))
    assert second.target is None and second.evidence == ("sky was red",)
    assert example_sources(second)[1] == 1  # the sentence the answer span lies in
    assert example_sources(third) == (((0, 4), (5, 9)), -1, ())


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"query": "Q"}, "has no 'context' field"),
        ({"context": "A. B.", "query": ""}, "row 0 of .* has an empty query"),
        ({"context": "A. B.", "query": 3}, "row 0 of .*: query must be text"),
        ({"context": "A. B.", "query": "Q", "answer_source": -1}, "answer_source must be a sentence index"),
        ({"context": "A. B.", "query": "Q", "answer_source": True}, "answer_source must be a sentence index"),
        ({"context": "A. B.", "query": "Q", "answer_source": "first"}, "answer_source must be a sentence index"),
        ({"context": "A. B.", "query": "Q", "answer_span": [3, 99]}, r"answer_span \[3, 99\] is outside the context"),
        ({"context": "A. B.", "query": "Q", "answer_span": [1]}, r"answer_span must be \[start, end\]"),
        ({"context": "A. B.", "query": "Q", "target": "  "}, "has an empty target"),
        ({"context": "A. B.", "query": "Q", "sources": [[0, 2]]}, "unknown field 'sources'"),
    ],
)
def test_bad_context_rows(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    if "context" not in row:  # not recognised as context data: read by the context loader directly
        with pytest.raises(InputError, match=message):
            load_context_file(_write(path, [row]))
        return
    with pytest.raises(InputError, match=message):
        datasets.load(_write(path, [row]))


def test_duplicate_ids_and_an_answer_source_past_the_sentences(tmp_path):
    rows = [{"context": "A. B.", "query": "Q", "id": "x"}, {"context": "C.", "query": "Q", "id": "x"}]
    with pytest.raises(InputError, match="example id 'x' occurs twice"):
        datasets.load(_write(tmp_path / "dup.jsonl", rows))
    data = datasets.load(_write(tmp_path / "far.jsonl", [{"context": "A. B.", "query": "Q", "answer_source": 2}]))
    with pytest.raises(InputError, match="answer_source 2 but its context has 2 sentences"):
        example_sources(data[0])


# ---------------------------------------------------------------------------- the zoo decoder
@pytest.mark.slow
def test_smollm2_answers_the_planted_question():
    """The model must use the planted source for attributions to it to mean anything: on 20
    documents of 512 tokens smollm2-135m's top next token is the planted answer for most (35 of
    40 when checked at 512 tokens, 38 of 40 at 1024)."""
    import heedful

    model = heedful.load("smollm2-135m")
    tokenizer = model.adapter.tokenizer
    data = datasets.load("planted", "test", n=20, length=512, tokenizer=tokenizer)
    answers = [tokenizer(ex.target, add_special_tokens=False)["input_ids"] for ex in data]
    assert all(len(a) == 1 for a in answers)  # one token each: the next-token target
    predicted = model.predict(data.texts, batch_size=4)
    hits = sum(p["index"] == a[0] for p, a in zip(predicted, answers, strict=True))
    assert hits >= 14, hits
