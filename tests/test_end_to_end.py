"""End to end on the real default model (built into the cache first if it is not there)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import heedful

SENTENCE = "a charming and often affecting journey"


@pytest.fixture(scope="module")
def model() -> heedful.Model:
    return heedful.load("minilm-sentiment")


@pytest.mark.slow  # 1,000 snippets through MiniLM, about 30 s on 2 cores: run with -m slow
def test_held_out_accuracy_meets_target_measured_here(model):
    """Accuracy on the 1,000 held-out movie snippets, measured on the model as loaded (not read
    from what its build recorded), and the build's record agrees with it."""
    import torch

    from heedful.datasets import load_split

    test = load_split("movies", "test")
    texts, labels = test["text"].tolist(), test["label"].to_numpy()
    assert len(texts) == 1000 and model.hf_model.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    predicted = []
    with torch.no_grad():
        for first in range(0, len(texts), 125):
            inputs = model.tokenizer(texts[first : first + 125], padding=True, truncation=True, max_length=64, return_tensors="pt")
            predicted.append(model.hf_model(**inputs).logits.argmax(-1).numpy())
    measured = float(np.mean(np.concatenate(predicted) == labels))
    print(f"held-out accuracy of minilm-sentiment: {measured:.4f} (n={len(texts)})")
    assert measured >= 0.85
    assert measured == pytest.approx(model.info["metadata"]["held_out"]["accuracy"], abs=0.002)


def test_default_sentence_is_positive_and_normxlogit_credits_the_sentiment_words(model):
    e = model.explain(SENTENCE)
    assert e.prediction["label"] == "POSITIVE" and e.target.label == "POSITIVE"
    assert e.raw_tokens == model.tokenizer.convert_ids_to_tokens(model.tokenizer(SENTENCE)["input_ids"])
    top_words = [w for w, _ in e.top(3)]
    assert "charming" in top_words


def test_methods_agree_with_a_removal_check(model):
    """Removing the top-2 tokens of a faithful method lowers the positive probability more than
    removing the bottom-2."""
    mask = model.tokenizer.mask_token
    for method in ("normxlogit", "integrated_gradients", "leave_one_out"):
        e = model.explain(SENTENCE, method=method)
        content = [i for i, s in enumerate(e.special) if not s]
        order = sorted(content, key=lambda i: -e.scores[i])

        def without(positions, e=e):
            ids = model.tokenizer(SENTENCE)["input_ids"]
            toks = [mask if i in positions else t for i, t in enumerate(model.tokenizer.convert_ids_to_tokens(ids))]
            return model.tokenizer.convert_tokens_to_string(toks[1:-1])

        p_top = model.predict(without(order[:2]))[0]
        p_bottom = model.predict(without(order[-2:]))[0]
        pos = lambda p: p["probability"] if p["label"] == "POSITIVE" else 1 - p["probability"]  # noqa: E731
        assert pos(p_top) < pos(p_bottom), method


def test_batch_of_held_out_sentences(model):
    from heedful.datasets import load_split

    texts = load_split("movies", "test")["text"].tolist()[:16]
    found = model.explain(texts, method="normxlogit", batch_size=8)
    assert len(found) == 16
    assert all(np.isfinite(e.scores).all() and len(e.scores) == len(e.tokens) for e in found)


def test_cli_acceptance_command():
    done = subprocess.run(
        [sys.executable, "-m", "heedful.cli", "explain", SENTENCE, "--method", "normxlogit", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {"tokens", "scores", "target", "method"} <= set(data)
    assert len(data["tokens"]) == len(data["scores"])
    assert data["target"]["label"] == "POSITIVE" and data["method"] == "normxlogit"
