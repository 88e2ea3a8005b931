"""ROAR / KAR (Hooker et al. 2019): the degraded examples equal a plain loop over each text's
ranked tokens, a method and the random baseline remove different tokens, the retrained
accuracy is that of a model trained by hand on the loop's examples, a second call retrains
nothing, an interrupted call keeps its retrains, and bad input is refused before any work."""

from __future__ import annotations

import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from heedful.errors import HeedfulError, InputError, Interrupted
from heedful.evaluate.roar import Retrainer, degraded_inputs, roar, roar_protocol
from heedful.tiny_models import tiny_hf
from heedful.zoo.retraining import retrainer as zoo_retrainer
from heedful.zoo.train import TrainConfig, encoded_retrainer, fine_tune_encoded, predict_encoded

TRAIN = [
    ("a charming and often affecting journey", "POSITIVE"),
    ("the movie was dull and far too long", "NEGATIVE"),
    ("an intelligent , funny and moving film", "POSITIVE"),
    ("what a waste of a talented cast", "NEGATIVE"),
    ("we watched it twice and loved every minute", "POSITIVE"),
    ("the plot is predictable yet the actors are wonderful", "POSITIVE"),
    ("the government alarms itself every year", "NEGATIVE"),
    ("this mall is closed but these malls are open", "NEGATIVE"),
]
TEST = [
    ("the sister of the doctors writes a letter", "POSITIVE"),
    ("the capital of france is paris", "NEGATIVE"),
    ("a dull and predictable film", "NEGATIVE"),
    ("a funny and wonderful journey", "POSITIVE"),
]
CONFIG = TrainConfig(batch_size=4, learning_rate=1e-3, epochs=2, threads=1, max_length=64)
WIDE = {"initializer_range": 0.2}


@pytest.fixture
def data_csv(tmp_path):
    path = tmp_path / "reviews.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label", "split"])
        writer.writerows([(t, y, "train") for t, y in TRAIN] + [(t, y, "test") for t, y in TEST])
    return str(path)


def _fresh(seed: int):
    return tiny_hf("bert", seed=seed, **WIDE)[0]


def _retrainer(fits: list, stop_after: int | None = None) -> Retrainer:
    """The tiny BERT's retrainer, counting its trainings (``KeyboardInterrupt`` at the
    ``stop_after + 1``-th)."""
    base = encoded_retrainer("tiny bert", _fresh, CONFIG)

    def fit(*args):
        if stop_after is not None and len(fits) == stop_after:
            raise KeyboardInterrupt
        fits.append(args[3])
        return base.fit(*args)

    return dataclasses.replace(base, fit=fit)


def _by_hand(tokenizer, text: str, scores: np.ndarray, k: float, mode: str, operator: str) -> list[int]:
    """One text degraded in a plain loop: its content tokens ranked by score (ties: the earlier
    first), the top round(k n) replaced by [MASK] or deleted (ROAR), or all the others (KAR)."""
    enc = tokenizer(text, return_special_tokens_mask=True)
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    content = [i for i in range(len(ids)) if not special[i]]
    ranking = sorted(content, key=lambda i: (-scores[i], i))
    top = set(ranking[: round(k * len(content))])
    removed = top if mode == "roar" else set(content) - top
    if operator == "delete":
        return [t for i, t in enumerate(ids) if i not in removed]
    return [tokenizer.mask_token_id if i in removed else t for i, t in enumerate(ids)]


def _rows(encoded: dict[str, torch.Tensor]) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)]


@pytest.mark.parametrize("operator", ["mask", "delete"])
def test_degraded_examples_equal_a_plain_loop(tiny, operator):
    model = tiny("bert")
    texts = [t for t, _ in TRAIN]
    rng = np.random.default_rng(0)
    # whole-number scores: many ties, so the tie order is checked too
    expls = [dataclasses.replace(e, scores=np.round(rng.normal(size=len(e.tokens)) * 1.5) + 0.0) for e in model.explain(texts, "saliency")]
    fractions = (0.1, 0.3, 0.5, 0.9)
    found = degraded_inputs(model.adapter, expls, roar_protocol(operator, fractions, "predicted", None), ("roar", "kar"), batch_size=3)
    changed = 0
    for mode in ("roar", "kar"):
        for k in fractions:
            rows = _rows(found[mode][k])
            assert len(rows) == len(texts)
            for b, (text, e) in enumerate(zip(texts, expls, strict=True)):
                expected = _by_hand(model.tokenizer, text, np.asarray(e.scores), k, mode, operator)
                assert rows[b] == expected, (mode, k, b)
                changed += expected != model.tokenizer(text)["input_ids"]
    assert changed > 40  # most rows lose tokens: the comparison is not of unchanged texts


def test_a_method_and_the_random_baseline_degrade_different_tokens(tiny):
    model = tiny("bert")
    texts = [t for t, _ in TRAIN]
    protocol = roar_protocol("mask", (0.5,), "predicted", None)
    by_method = {m: _rows(degraded_inputs(model.adapter, model.explain(texts, m), protocol)["roar"][0.5]) for m in ("saliency", "random")}
    assert by_method["saliency"] != by_method["random"]
    masked = [sum(t == model.tokenizer.mask_token_id for t in row) for row in by_method["saliency"]]
    assert masked == [sum(t == model.tokenizer.mask_token_id for t in row) for row in by_method["random"]]  # as many, other ones


def test_roar_retrains_from_the_degraded_examples_and_a_second_call_retrains_nothing(tiny, data_csv, tmp_path):
    model = tiny("bert")
    fits: list = []
    store = tmp_path / "store"
    args = dict(store=store, dataset=data_csv, methods=["saliency"], fractions=(0.5,), modes=("roar", "kar"), train_n=None, progress=False)
    first = roar(model, _retrainer(fits), **args)
    assert len(fits) == 5  # the reference, then random and saliency, each ROAR and KAR at k = 0.5
    assert first.retrained == 5 and first.explained == 2 * (len(TRAIN) + len(TEST)) and first.n_test == len(TEST)
    table = first.table.set_index(["mode", "method", "k"])
    assert list(table.index) == [("roar", "(unmodified)", 0.0), ("roar", "random", 0.5), ("kar", "random", 0.5),
                                 ("roar", "saliency", 0.5), ("kar", "saliency", 0.5)]
    assert np.isnan(table.loc[("roar", "random", 0.5), "vs_random"]) and np.isfinite(table.loc[("roar", "saliency", 0.5), "vs_random"])
    assert (table["steps"] == 4).all()  # 8 train texts in batches of 4, two epochs

    # the ROAR row by hand: the loop's degraded examples, a fresh seed-0 model trained on them
    # explained as the run explains them: each split in model batches of 16
    expls = [e for rows in (TRAIN, TEST) for e in model.explain([t for t, _ in rows], "saliency", batch_size=16, max_length=CONFIG.max_length)]
    degraded = [_by_hand(model.tokenizer, e.text, np.asarray(e.scores), 0.5, "roar", "mask") for e in expls]
    width = max(map(len, degraded))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in degraded])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in degraded])
    types = torch.zeros_like(ids)
    train_rows = {"input_ids": ids[: len(TRAIN)], "attention_mask": mask[: len(TRAIN)], "token_type_ids": types[: len(TRAIN)]}
    test_rows = {"input_ids": ids[len(TRAIN):], "attention_mask": mask[len(TRAIN):], "token_type_ids": types[len(TRAIN):]}
    gold = {"NEGATIVE": 0, "POSITIVE": 2}
    fresh = _fresh(0)
    fine_tune_encoded(fresh, train_rows, np.array([gold[y] for _, y in TRAIN]), dataclasses.replace(CONFIG, seed=0), progress=False)
    predicted = predict_encoded(fresh, test_rows, progress=False).argmax(axis=-1)
    assert table.loc[("roar", "saliency", 0.5), "accuracy"] == pytest.approx(np.mean(predicted == [gold[y] for _, y in TEST]))
    # per test example, for paired comparisons between methods: the hand-trained model's hits
    assert list(first.correct[("roar", "saliency", 0.5, 0)]) == [float(p == gold[y]) for p, (_, y) in zip(predicted, TEST, strict=True)]
    assert set(first.correct) == {(m, method, k, 0) for m, method, k in table.index}

    fits.clear()
    again = roar(model, _retrainer(fits), **args)
    assert fits == [] and again.retrained == 0 and again.explained == 0
    assert again.table.equals(first.table)


def test_an_interrupted_roar_keeps_its_retrains_and_resumes_the_rest(tiny, data_csv, tmp_path):
    model = tiny("bert")
    args = dict(store=tmp_path / "store", dataset=data_csv, methods=["grad_x_input"], fractions=(0.3, 0.7), train_n=6, test_n=3, progress=False)
    fits: list = []
    with pytest.raises(Interrupted, match="2 of 5 retrains stored"):
        roar(model, _retrainer(fits, stop_after=2), **args)
    fits.clear()
    resumed = roar(model, _retrainer(fits), **args)
    assert len(fits) == 3 and resumed.retrained == 3 and resumed.explained == 0 and (resumed.n_train, resumed.n_test) == (6, 3)
    assert len(resumed.table) == 5


def test_roar_refuses_bad_input_in_one_line_before_any_work(tiny, data_csv, tmp_path):
    model = tiny("bert")
    store = tmp_path / "store"
    fits: list = []
    good = dict(store=store, dataset=data_csv, methods=["saliency"], fractions=(0.5,), progress=False)
    cases = [
        (dict(methods=["salency"]), "unknown method"),
        (dict(methods="saliency"), "a list of methods"),
        (dict(fractions=(0.0, 0.5)), "strictly between 0 and 1"),
        (dict(fractions=(1.0,)), "strictly between 0 and 1"),
        (dict(fractions=(0.5, 1.5)), "strictly between 0 and 1"),
        (dict(fractions=(0.5, 0.5)), "repeat"),
        (dict(operator="blank"), "unknown ROAR operator"),
        (dict(modes=("roar", "keep")), "modes must be among"),
        (dict(seeds=()), "seeds must be"),
        (dict(seeds=(-1,)), "seeds must be"),
        (dict(train_n=0), "train_n must be"),
        (dict(label="true"), "label must be"),
    ]
    for change, message in cases:
        with pytest.raises(HeedfulError, match=message) as caught:
            roar(model, _retrainer(fits), **{**good, **change})
        assert "\n" not in str(caught.value.message), change
    with pytest.raises(InputError, match="retrains a classifier"):
        roar(tiny("bert", "regression"), _retrainer(fits), **good)
    with pytest.raises(InputError, match="must be a Retrainer"):
        roar(model, CONFIG, **good)
    assert fits == [] and not store.exists()  # nothing trained, no store written
    with pytest.raises(InputError, match="cannot retrain 'smollm2-sentiment'"):
        zoo_retrainer("smollm2-sentiment")
    with pytest.raises(InputError, match="no field 'epoch'"):
        zoo_retrainer("minilm-sentiment", epoch=1)


@pytest.mark.parametrize(
    ("methods", "problem"),
    [("saliency,saliency[multiply_by_inputs=true]", "names a method twice"), ("saliency[abs=true", "lacks its closing ']'")],
)
def test_the_roar_script_refuses_bad_method_rows_in_one_line_before_loading_anything(methods, problem, tmp_path):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "roar.py"
    done = subprocess.run(
        [sys.executable, str(script), "--methods", methods, "--store", str(tmp_path), "--out", str(tmp_path / "roar.md")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert problem in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "roar.md").exists() and not any(tmp_path.iterdir())
