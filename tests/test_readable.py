"""Tokens as people read them: every view and return value meant for people shows decoded text
(no byte-level ``Ġ`` / ``Ċ`` or SentencePiece ``▁``), line breaks as ``⏎`` and whitespace-only
tokens as ``␣``; the tokenizer's symbols stay in ``raw_tokens``; explanations stored before
``raw_tokens`` existed still load."""

from __future__ import annotations

import doctest
import json

import numpy as np
from conftest import run_cli, saved_tiny
from rich.console import Console
from test_generation import _sentencepiece_llama

import heedful
import heedful.engine.readable
from heedful.evaluate.store import ResultsStore, Subject, run_key
from heedful.fingerprint import ModelFingerprint
from heedful.render.terminal import header

RAW = ("Ġ", "Ċ", "▁")


def _printed(renderable, width: int = 200) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def _readable(tokens: list[str]) -> bool:
    return not any(mark in token for token in tokens for mark in RAW) and not any("\n" in t for t in tokens)


def test_marks_are_documented_and_hold():
    outcome = doctest.testmod(heedful.engine.readable)
    assert outcome.attempted > 0 and outcome.failed == 0
    assert heedful.engine.readable.marked("\r\n\t") == "⏎⇥" and heedful.engine.readable.marked("a\tb") == "a⇥b"


def test_byte_level_explanation_reads_as_text_and_keeps_its_raw_tokens(tiny):
    lm = tiny("gpt2", "causal_lm")
    text = "the cat sat\n\n on"
    expl = lm.explain(text, "grad_x_input")
    raw = lm.tokenizer.convert_ids_to_tokens(lm.tokenizer(text)["input_ids"])
    assert expl.raw_tokens == raw and any(mark in "".join(raw) for mark in ("Ġ", "Ċ"))
    assert _readable(expl.tokens) and len(expl.tokens) == len(raw)
    assert [t for t, r in zip(expl.tokens, raw, strict=True) if r == "Ċ"] == ["⏎", "⏎"]
    assert all(t.startswith(" ") for t, r in zip(expl.tokens, raw, strict=True) if r.startswith("Ġ") and len(r) > 1)
    assert "".join(expl.tokens).replace("⏎", "\n").replace("␣", " ") == text
    assert _readable([token for token, _ in expl.top(len(raw))])
    assert "⏎⏎" in expl.words().words and _readable(expl.words().words)
    assert _readable([expl.target.label, expl.prediction["label"]])
    frame = expl.to_pandas()
    assert frame["token"].tolist() == expl.tokens and frame["raw_token"].tolist() == raw
    shown = _printed(header(expl))
    assert not any(mark in shown for mark in RAW) and shown.count("\n") == 1


def test_generation_reads_as_text_and_round_trips(tiny):
    lm = tiny("gpt2", "causal_lm")
    g = lm.explain_generation("the cat sat", "grad_x_input", continuation=" on\nthe mat")
    assert "Ċ" in g.raw_tokens and "⏎" in g.generated_tokens and _readable(g.generated_tokens)
    assert _readable(g.words()[0]) and _readable([t for t, _ in g.top(0, 3)])
    back = heedful.GenerationExplanation.from_dict(json.loads(g.to_json()))
    assert back.tokens == g.tokens and back.raw_tokens == g.raw_tokens
    assert set(g.to_pandas()["raw_token"]) <= set(g.raw_tokens)
    assert not any(mark in _printed(g) for mark in RAW)


def test_sentencepiece_tokens_keep_their_leading_space():
    lm = _sentencepiece_llama()
    expl = lm.explain("the cat sat on the mat", "grad_x_input")
    assert expl.raw_tokens[2].startswith("▁") and expl.tokens[2] == expl.raw_tokens[2].replace("▁", " ")
    assert expl.tokens[0] == "<s>" and _readable(expl.tokens)
    assert "".join(expl.tokens[1:]).replace("␣", " ") == " the cat sat on the mat"


def test_span_target_header_reads_its_log_probability_not_a_prediction(tiny):
    lm = tiny("gpt2", "causal_lm")
    span = lm.explain("the cat sat", "grad_x_input", target=" on the\nmat")
    shown = _printed(header(span))
    assert 'explaining " on the⏎mat"' in shown and shown.count("\n") == 1
    assert "predicted" not in shown and f"log p {span.prediction['log_probability']:.3f}" in shown
    html = span.to_html()
    assert "(0.00)" not in html and "log p" in html


def test_json_round_trip_and_explanations_stored_before_raw_tokens_load(tiny, tmp_path):
    lm = tiny("gpt2", "causal_lm")
    expl = lm.explain("the cat sat on", "grad_x_input")
    data = json.loads(expl.to_json())
    assert data["tokens"] == expl.tokens and data["raw_tokens"] == expl.raw_tokens
    back = heedful.Explanation.from_dict(data)
    assert back.tokens == expl.tokens and back.raw_tokens == expl.raw_tokens
    old = {k: v for k, v in data.items() if k != "raw_tokens"}
    old["tokens"] = expl.raw_tokens  # what a store written before raw_tokens holds
    subject = Subject("tiny-gpt2", ModelFingerprint("w", "c", "t"), "data.csv", "d", "test")
    with ResultsStore(tmp_path / "store") as store:
        run = run_key(subject, "grad_x_input")
        store.put_explanation_texts(run, [("old", json.dumps(old)), ("new", expl.to_json())])
        found = store.get_explanations(run)
    assert found["old"].raw_tokens == found["old"].tokens == expl.raw_tokens
    assert found["new"].tokens == expl.tokens and found["new"].raw_tokens == expl.raw_tokens
    np.testing.assert_array_equal(found["old"].scores, expl.scores)


def test_cli_json_and_the_query_generate_header_read_as_text(monkeypatch, capsys, tmp_path):
    folder = saved_tiny(tmp_path / "tiny-gpt2", "gpt2", "causal_lm")
    code, out, err = run_cli(monkeypatch, capsys, "explain", "the cat sat on", "--model", folder, "--method", "grad_x_input", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert _readable(data["tokens"]) and data["raw_tokens"][1].startswith("Ġ")
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "the cat sat. the dog ran.", "--model", folder, "--sources", "sentences",
        "--query", "who sat?", "--generate", "4", "--method", "source_loo",
    )
    assert code == 0, err
    flat = " ".join(out.split())  # the header may wrap at 80 columns
    assert "explaining" in flat and "log p" in flat and "predicted" not in flat and not any(mark in out for mark in RAW)
