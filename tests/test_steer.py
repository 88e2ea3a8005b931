"""Steering generation by suppressing prompt words (seed paper Section 5.4.2): embedding
down-weighting, generation from embeddings, interest before/after, rendering, CLI and errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny

from heedful.errors import InputError
from heedful.interest.steer import decoding_modes, generate, phrase_positions, steer
from heedful.interest.steering_view import steering_page, steering_renderable
from heedful.interest.suppress import downweight

PROMPT = "the movie was dull and far too long"
FAST = {"max_steps": 4, "samples": 2}


@pytest.fixture(params=["gpt2", "llama"])
def lm(request, tiny):
    return tiny(request.param, "causal_lm")


def test_phrase_positions_cover_every_token_of_the_phrase(lm):
    batch = lm.adapter.encode([PROMPT])
    hit = phrase_positions(batch, ["far too long"])
    covered = "".join(PROMPT[s:e] for (s, e), h in zip(batch.offsets[0], hit.tolist(), strict=False) if h)
    assert covered.replace(" ", "") == "fartoolong"
    assert phrase_positions(batch, ["DULL"]).sum() >= 1  # case-insensitive
    with pytest.raises(InputError, match="not in the prompt"):
        phrase_positions(batch, ["ull"])  # part of a word is not a word
    with pytest.raises(InputError, match="not in the prompt"):
        phrase_positions(batch, ["paris"])


def test_downweight_scales_only_the_suppressed_embeddings(lm):
    adapter = lm.adapter
    batch = adapter.encode([PROMPT])
    hit = phrase_positions(batch, ["dull"])[None]
    clean = adapter.embed(batch.input_ids)
    for w in (0.0, 0.5):
        scaled = downweight(adapter, batch, hit, w)
        assert torch.allclose(scaled[hit], w * clean[hit])
        assert torch.equal(scaled[~hit], clean[~hit])


def test_weight_one_gives_the_unsuppressed_generation_exactly(lm):
    result = steer(lm, PROMPT, ["far too long"], weight=1.0, max_new_tokens=6, beams=2, **FAST)
    assert [c.mode for c in result.continuations] == ["greedy", "beam"]
    batch = lm.adapter.encode([PROMPT])
    for c in result.continuations:
        assert c.original_ids == c.steered_ids and c.original == c.steered
        assert c.settings["do_sample"] is False and c.settings["num_beam_groups"] == 1
        # starting from embeddings is starting from the ids
        with torch.no_grad():
            from_ids = lm.hf_model.generate(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, do_sample=False,
                num_beams=c.settings["num_beams"], max_new_tokens=6, pad_token_id=lm.adapter.pad_token_id,
            )
        assert from_ids[0, batch.input_ids.shape[1] :].tolist() == c.original_ids
    np.testing.assert_allclose(result.interest_after, result.interest_before, atol=1e-6)
    assert result.next_before == result.next_after


def test_suppression_changes_the_input_and_interest_is_normalised(lm):
    result = steer(lm, PROMPT, ["dull", "far too long"], weight=0.0, max_new_tokens=4, beams=2, seed=3, **FAST)
    n = len(result.tokens)
    assert len(result.interest_before) == len(result.interest_after) == len(result.suppressed) == n
    content = ~np.asarray(result.special)
    for scores in (result.interest_before, result.interest_after):
        assert scores[content].sum() == pytest.approx(1.0, rel=1e-5)
        assert (scores[content] > 0).all()
    assert "".join(result.suppressed_text).replace(" ", "") == "dullfartoolong"
    assert not np.allclose(result.interest_after, result.interest_before)
    assert result.steps == [4, 4]
    again = steer(lm, PROMPT, ["dull", "far too long"], weight=0.0, max_new_tokens=4, beams=2, seed=3, **FAST)
    np.testing.assert_array_equal(again.interest_after, result.interest_after)  # seeded


def test_generation_starts_from_the_scaled_embeddings(lm, monkeypatch):
    seen = []
    original = lm.hf_model.generate

    def spy(*args, **kwargs):
        seen.append(kwargs["inputs_embeds"].clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(lm.hf_model, "generate", spy)
    batch = lm.adapter.encode([PROMPT])
    hit = phrase_positions(batch, ["dull"])
    steer(lm, PROMPT, ["dull"], weight=0.25, max_new_tokens=2, beams=2, **FAST)
    clean = lm.adapter.embed(batch.input_ids)[0]
    assert len(seen) == 4  # greedy and beam, each without and with suppression
    for embeds in seen[::2]:
        assert torch.equal(embeds[0], clean)
    for embeds in seen[1::2]:
        assert torch.allclose(embeds[0, hit], 0.25 * clean[hit]) and torch.equal(embeds[0, ~hit], clean[~hit])


def test_errors_before_any_work(tiny, lm):
    with pytest.raises(InputError, match="causal language model"):
        steer(tiny("bert"), PROMPT, ["dull"])
    with pytest.raises(InputError, match="not in the prompt"):
        steer(lm, PROMPT, ["paris"])
    with pytest.raises(InputError, match="no words"):
        steer(lm, PROMPT, [])
    with pytest.raises(InputError, match="beams"):
        decoding_modes(5, beams=1)
    with pytest.raises(InputError, match="finite"):
        steer(lm, PROMPT, ["dull"], weight=float("nan"))


def test_paper_defaults_fill_up_to_max_length_150(lm, monkeypatch):
    calls = []
    module = sys.modules["heedful.interest.steer"]  # the package exports the function of the same name
    monkeypatch.setattr(module, "generate", lambda adapter, embeds, settings: calls.append(settings) or [0])
    steer(lm, PROMPT, ["dull"], **FAST)
    n = len(lm.adapter.encode([PROMPT]).tokens[0])
    assert {c["max_new_tokens"] for c in calls} == {min(150, lm.adapter.max_length) - n}
    assert [c["num_beams"] for c in calls] == [1, 1, 3, 3]


def test_rendering_terminal_and_self_contained_html(lm):
    from rich.console import Console

    result = steer(lm, PROMPT, ["far too long"], max_new_tokens=3, beams=2, **FAST)
    page = steering_page(result)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    for c in result.continuations:
        assert c.original.strip()[:3] in page or not c.original.strip()
    assert page.count("hf-bar") >= 2 * len(result.tokens)
    console = Console(record=True, width=160)
    console.print(steering_renderable(result))
    text = console.export_text()
    assert "greedy" in text and "beam" in text and "before" in text and "after" in text


def test_generate_returns_only_new_tokens(lm):
    batch = lm.adapter.encode([PROMPT])
    ids = generate(lm.adapter, lm.adapter.embed(batch.input_ids), decoding_modes(5)["greedy"])
    assert 1 <= len(ids) <= 5


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-gpt2-lm"), "gpt2", "causal_lm")


def test_cli_steer_prints_both_generations_and_writes_html(monkeypatch, capsys, lm_dir, tmp_path):
    page = tmp_path / "steer.html"
    code, out, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--prompt", PROMPT, "--suppress", "far too long",
        "--max-new-tokens", "3", "--beams", "2", "--html", str(page), "-o", "max_steps=3", "-o", "samples=2",
    )
    assert code == 0, err
    assert "greedy" in out and "beam" in out and "far too long" in out
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_cli_steer_errors(monkeypatch, capsys, lm_dir):
    code, _, err = run_cli(monkeypatch, capsys, "steer", "--model", lm_dir, "--prompt", PROMPT, "--suppress", "paris")
    assert code == 2 and "not in the prompt" in err
