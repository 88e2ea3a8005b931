"""Steering vectors (heedful.inside.steering): contrastive activation addition against the
``steering-vectors`` package (its vector and its steered forward pass and generation), extraction
by optimisation reproduces its sentence, the sentiment sweep's rows, and the command line."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli, saved_tiny

from heedful.datasets import Dataset, Example
from heedful.errors import InputError
from heedful.inside.steering import (
    SteeringVector,
    _decode,
    _start_ids,
    contrastive,
    extract,
    mean_difference,
    transfer,
    unsteered,
)
from heedful.inside.sweep import sentiment_sweep, snippet_prompts, wilson

POSITIVE, NEGATIVE = "we loved every minute", "what a waste of a talented cast"
PROMPT = "the movie was"


@pytest.fixture(params=["llama", "gpt2"])
def lm(request, tiny):
    return tiny(request.param, "causal_lm")


def test_caa_equals_the_steering_vectors_package(lm):
    """steering-vectors 0.12.2 (Tan et al., ``train_steering_vector`` with ``layer_type=
    "decoder_block"``, ``read_token_index=-1``; ``apply(multiplier, min_token_index=0)``) is the
    oracle of the vector, the steered logits and the steered greedy generation."""
    sv = pytest.importorskip("steering_vectors")
    theirs = sv.train_steering_vector(
        lm.hf_model, lm.tokenizer, [(POSITIVE, NEGATIVE), ("an intelligent , funny film", "the plot is dull")],
        layers=[1], layer_type="decoder_block", read_token_index=-1, show_progress=False,
    )
    ours = contrastive(lm, [POSITIVE, "an intelligent , funny film"], [NEGATIVE, "the plot is dull"], 1)
    torch.testing.assert_close(ours.vector, theirs.layer_activations[1], rtol=1e-5, atol=1e-5)
    ids = lm.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = lm.hf_model(input_ids=ids).logits
        with theirs.apply(lm.hf_model, multiplier=3.0, min_token_index=0):
            expected = lm.hf_model(input_ids=ids).logits
            their_gen = lm.hf_model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
        with ours.applied(lm, 3.0):
            found = lm.hf_model(input_ids=ids).logits
    assert not torch.allclose(plain, expected)  # the vector does something
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
    assert ours.generate(lm, PROMPT, 3.0, 6).continuations[0] == their_gen[0, ids.shape[1] :].tolist()
    with torch.no_grad():  # hooks gone after the block
        torch.testing.assert_close(lm.hf_model(input_ids=ids).logits, plain)


def test_mean_difference_is_the_difference_of_the_two_sets_mean_states(lm):
    pos, neg = [POSITIVE, "a charming journey"], [NEGATIVE]
    vector = mean_difference(lm, pos, neg, 0)

    def mean_state(text):
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return lm.hf_model(input_ids=ids, output_hidden_states=True).hidden_states[1][0].mean(0)

    expected = torch.stack([mean_state(t) for t in pos]).mean(0) - mean_state(neg[0])
    torch.testing.assert_close(vector.vector, expected, rtol=1e-5, atol=1e-5)


def test_zero_coefficient_generates_what_the_model_alone_generates(lm):
    vector = contrastive(lm, POSITIVE, NEGATIVE, -1)
    assert vector.layer == lm.adapter.num_layers - 1
    assert vector.generate(lm, PROMPT, 0.0, 5).continuations == lm.generate(PROMPT, 5).continuations


def _reachable_sentence(lm, layer: int) -> str:
    """A sentence some vector at ``layer`` makes the tiny model write: greedy decoding from
    "the movie"'s first token with a random vector added, kept when its text re-tokenizes to the
    same ids (no replacement characters), so that it is reachable by construction."""
    ids, lead, front = _start_ids(lm, "the movie")
    for seed in range(20):
        z = torch.randn(lm.adapter.hidden_size, generator=torch.Generator().manual_seed(seed)) * 3
        text = _decode(lm, SteeringVector(layer, z), ids, lead, None, front)
        again = lm.tokenizer.decode(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
        if "\ufffd" not in text and again == text and unsteered(lm, text) != text:
            return text
    raise AssertionError("no reachable sentence among 20 random vectors")


def test_extraction_makes_the_model_write_the_sentence(tiny):
    """Subramani et al.'s defining property: with the extracted vector added (from another
    random start than the one that wrote the sentence), greedy decoding from the first token
    writes the sentence exactly, which the model alone does not."""
    lm = tiny("llama", "causal_lm")
    sentence = _reachable_sentence(lm, 1)
    found = extract(lm, sentence, 1, timestep=None, steps=300, lr=0.1, check_every=10, seed=7)
    assert found.reproduced and found.decoded == sentence, found
    assert transfer(lm, found, torch.zeros_like(found.vector.vector), 1.0) == sentence


def test_wilson_interval_matches_the_textbook_value():
    low, high = wilson(8, 10)  # Wilson (1927) score interval, z = 1.96: 0.490 .. 0.943
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 5)[0] == pytest.approx(0.0, abs=1e-12)


def test_sweep_rows_hold_rates_inside_their_intervals_and_zero_is_the_baseline(tiny):
    lm, judge = tiny("gpt2", "causal_lm"), tiny("bert")
    data = Dataset("snips", "test", [Example(str(i), t, label=0) for i, t in enumerate(
        ["the movie was dull and far too long", "what a waste of a talented cast indeed", "the plot is predictable yet the actors are fine"]
    )])
    prompts = snippet_prompts(data, 4, label=0)
    vector = contrastive(lm, POSITIVE, NEGATIVE, 1)
    result = sentiment_sweep(lm, judge, prompts, vector, [0.0, 4.0], max_new_tokens=4, batch_size=2)
    assert [row.coefficient for row in result.rows] == [0.0, 4.0]
    for row in result.rows:
        assert row.n == 3 and row.success_low <= row.success <= row.success_high
        assert row.perplexity_low <= row.perplexity <= row.perplexity_high and row.perplexity > 1
    plain = lm.generate(prompts, 4)
    assert result.rows[0].examples == [lm.tokenizer.decode(c, skip_special_tokens=True) for c in plain.continuations]
    with pytest.raises(InputError, match="no label"):
        sentiment_sweep(lm, judge, prompts, vector, [1.0], toward="JOY")


def test_steering_refuses_bad_input(tiny, lm):
    with pytest.raises(InputError, match="language model"):
        contrastive(tiny("bert"), POSITIVE, NEGATIVE, 0)
    with pytest.raises(InputError, match="does not exist"):
        contrastive(lm, POSITIVE, NEGATIVE, 99)
    with pytest.raises(InputError, match="in pairs"):
        contrastive(lm, [POSITIVE, "x"], [NEGATIVE], 0)
    with pytest.raises(InputError, match="non-empty"):
        contrastive(lm, " ", NEGATIVE, 0)
    assert isinstance(contrastive(lm, POSITIVE, NEGATIVE, 0), SteeringVector)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-llama-lm"), "llama", "causal_lm")


def test_cli_steer_vector_prints_both_generations(monkeypatch, capsys, lm_dir):
    code, out, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "caa", "--positive", POSITIVE, "--negative", NEGATIVE,
        "--layer", "1", "--coefficient", "4", "--prompt", PROMPT, "--max-new-tokens", "4",
    )
    assert code == 0, err
    assert "without the vector" in out and "with the vector" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vector", "caa", "--positive", POSITIVE, "--prompt", PROMPT], "--negative"),
        (["--vector", "caa", "--positive", POSITIVE, "--negative", NEGATIVE, "--suppress", "movie", "--prompt", PROMPT], "two modes"),
        (["--vector", "cab", "--positive", POSITIVE, "--negative", NEGATIVE, "--prompt", PROMPT], "did you mean 'caa'"),
        (["--vector", "caa", "--positive", POSITIVE, "--negative", NEGATIVE, "--layer", "40", "--prompt", PROMPT], "does not exist"),
        (["--sweep", "--positive", POSITIVE, "--negative", NEGATIVE, "--coefficients", "1,x"], "comma-separated"),
        (["--prompt", PROMPT], "nothing to steer"),
    ],
)
def test_cli_steer_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, lm_dir, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "steer", "--model", lm_dir, *args)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_cli_steer_mean_vector_takes_n_texts_of_each_sentiment(monkeypatch, capsys, lm_dir, tmp_path):
    """The mean-difference vector of ``--dataset``'s labels: the command's vector is the API's on
    the first N texts of each sentiment (the file lists the positives first)."""
    rows = ["text,label"] + [f"good film number {i},1" for i in range(4)] + ["a dull plot,0", "a waste of time,0", "boring,0"]
    data = tmp_path / "labelled.csv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    seen = {}
    real = mean_difference

    def spy(model, positive, negative, layer, read="mean"):
        seen["sets"] = (list(positive), list(negative))
        return real(model, positive, negative, layer, read)

    monkeypatch.setattr("heedful.inside.steering.mean_difference", spy)
    code, out, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "mean", "--dataset", str(data), "-n", "2",
        "--layer", "0", "--prompt", PROMPT, "--max-new-tokens", "3",
    )
    assert code == 0, err
    assert seen["sets"] == (["good film number 0", "good film number 1"], ["a dull plot", "a waste of time"])
    assert "with the vector" in out
