"""Rectifying misclassifications by suppressing top-attributed tokens (``heedful rectify``)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny
from tiny import CORPUS

import heedful
from heedful.interest import rectify as rect

TEXTS = list(dict.fromkeys(CORPUS))  # the ten distinct corpus sentences


def _write_csv(path, texts, labels):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text", "label"])
        for i, (t, y) in enumerate(zip(texts, labels, strict=True)):
            writer.writerow([f"ex{i}", t, y])
    return str(path)


def _by_hand(model, texts, method, ratio):
    """Predictions after erasing the top ``ratio`` of content tokens, computed without heedful's
    suppression code: rank the explanation's scores in Python, write [MASK] into the ids, run
    the transformers model directly."""
    tok, hf = model.tokenizer, model.hf_model
    found = []
    for text in texts:
        expl = model.explain(text, method)
        ids = tok(text)["input_ids"]
        content = [i for i, sp in enumerate(expl.special) if not sp]
        k = int(np.ceil(len(content) * ratio - 1e-9))
        ranked = sorted(content, key=lambda i: (-expl.scores[i], i))[:k]
        for i in ranked:
            ids[i] = tok.mask_token_id
        with torch.no_grad():
            found.append(int(hf(input_ids=torch.tensor([ids])).logits.argmax()))
    return found


def test_suppressed_inputs_are_exactly_what_the_model_sees(tiny, monkeypatch):
    model = tiny("distilbert")
    adapter = model.adapter
    texts = [TEXTS[0], TEXTS[6]]
    batch = adapter.encode(texts)
    scores = torch.tensor(np.random.default_rng(0).normal(size=(2, batch.seq_len)))
    expected = {}
    for b in range(2):
        n = int(batch.lengths[b])
        content = [i for i in range(n) if not batch.special_mask[b, i]]
        for ratio in (0.25, 0.5):
            k = int(np.ceil(len(content) * ratio - 1e-9))
            top = sorted(content, key=lambda i: -float(scores[b, i]))[:k]
            ids = batch.input_ids[b, :n].clone()
            ids[top] = adapter.tokenizer.mask_token_id
            expected[(b, ratio)] = ids.tolist()
    seen = []
    real_forward = adapter.forward

    def spy(batch_, anchor, **kw):
        ids, mask = kw.get("input_ids"), kw.get("attention_mask")
        if ids is not None:
            seen.extend(row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True))
        return real_forward(batch_, anchor, **kw)

    monkeypatch.setattr(adapter, "forward", spy)
    predicted, erased = rect.predict_suppressed(model, batch, scores, [0.25, 0.5])
    assert sorted(seen) == sorted(expected.values())  # every suppressed copy, and nothing else
    monkeypatch.undo()
    for (b, ratio), ids in expected.items():
        with torch.no_grad():
            direct = int(model.hf_model(input_ids=torch.tensor([ids])).logits.argmax())
        assert predicted[b, [0.25, 0.5].index(ratio)] == direct
        assert erased[b, [0.25, 0.5].index(ratio)] == sum(a != c for a, c in zip(ids, batch.input_ids[b].tolist(), strict=False))


def test_gains_on_a_hand_made_error_set(tiny, tmp_path):
    model = tiny("distilbert")
    before = rect.classify(model, TEXTS)
    ratios = [0.3, 0.6]
    after = np.array([_by_hand(model, TEXTS, "leave_one_out", r) for r in ratios]).T  # [T, R]
    changed = np.flatnonzero(after[:, 1] != before)
    assert len(changed) >= 2, "the tiny model should change some predictions at ratio 0.6"
    # examples 0-2 are classified correctly; among the rest, the first changed one at r=0.6 is
    # fixed (gold = its new class), the second changed one is changed but not fixed (gold = the
    # third class), the unchanged ones stay wrong
    labels = list(before)
    errors = [i for i in range(3, len(TEXTS))]
    fixed_one, other_one = [i for i in changed if i >= 3][:2]
    for i in errors:
        if i == fixed_one:
            labels[i] = after[i, 1]
        else:
            labels[i] = ({0, 1, 2} - {before[i], after[i, 1]}).pop()
    data = _write_csv(tmp_path / "hand.csv", TEXTS, [int(y) for y in labels])
    result = rect.rectify(model, data, ["leave_one_out"], ratios, split="all")
    assert result.n_total == len(TEXTS) and result.correct == 3 and result.n_errors == len(errors)
    assert result.error_ids == [f"ex{i}" for i in errors]
    gain = result.methods["leave_one_out"]
    np.testing.assert_array_equal(gain.predictions, after[errors])
    gold = np.array(labels)[errors]
    np.testing.assert_array_equal(gain.fixed, (after[errors] == gold[:, None]).sum(axis=0))
    assert gain.fixed[1] == 1
    np.testing.assert_array_equal(gain.changed, (after[errors] != before[errors][:, None]).sum(axis=0))
    np.testing.assert_allclose(result.error_gain("leave_one_out"), gain.fixed / len(errors))
    np.testing.assert_allclose(result.accuracy_after("leave_one_out"), (3 + gain.fixed) / len(TEXTS))
    np.testing.assert_allclose(result.whole_gain("leave_one_out"), gain.fixed / len(TEXTS))
    assert result.accuracy_before == pytest.approx(0.3)


def test_gain_arithmetic_and_best_ratio():
    result = rect.Rectification(
        model="m", dataset="d", split="test", ratios=[0.1, 0.2, 0.3], n_total=200, correct=150,
        error_ids=[str(i) for i in range(50)], gold=np.zeros(50, int), predicted=np.ones(50, int),
    )
    result.methods["x"] = rect.MethodGain("x", {}, np.zeros((50, 3), int), np.array([5, 20, 20]), np.array([9, 30, 40]), np.array([1.0, 2.0, 3.0]), 0.1)
    np.testing.assert_allclose(result.error_gain("x"), [0.1, 0.4, 0.4])
    np.testing.assert_allclose(result.accuracy_after("x"), [0.775, 0.85, 0.85])
    np.testing.assert_allclose(result.whole_gain("x"), [0.025, 0.1, 0.1])
    assert result.best("x") == 1
    table = rect.rows(result)
    assert len(table) == 3 and table[1]["fixed"] == 20 and table[1]["accuracy_after"] == pytest.approx(0.85)


def test_store_is_shared_with_the_bench(tiny, tmp_path):
    from heedful.evaluate import get_protocol
    from heedful.evaluate.bench import BenchSpec, run_bench

    model = tiny("distilbert")
    before = rect.classify(model, TEXTS)
    labels = [int(y) if i < 4 else int((y + 1) % 3) for i, y in enumerate(before)]
    data = _write_csv(tmp_path / "d.csv", TEXTS, labels)
    first = rect.rectify(model, data, ["random"], [0.5], split="all", store=tmp_path / "store", model_label="tiny")
    again = rect.rectify(model, data, ["random"], [0.5], split="all", store=tmp_path / "store", model_label="tiny")
    assert first.n_errors == 6 and again.methods["random"].from_store == 6
    # explanation time read back from the store's cost record when nothing was computed
    assert again.methods["random"].seconds == pytest.approx(first.methods["random"].seconds, rel=1e-6)
    assert again.methods["random"].seconds > 0
    np.testing.assert_array_equal(first.methods["random"].predictions, again.methods["random"].predictions)
    spec = BenchSpec(model, data, ["random"], ["aopc"], get_protocol("default", random_seeds=1), tmp_path / "store", split="all", model_label="tiny")
    bench = run_bench(spec, progress=False)
    assert bench.computed["explanations"] == len(TEXTS) - 6  # the errors' explanations were reused


def test_rejects_non_classifiers_and_bad_ratios(tiny):
    with pytest.raises(heedful.InputError, match="classifier"):
        rect.rectify(tiny("bert", "regression"), "movies", ["random"], n=2)
    with pytest.raises(heedful.InputError, match="ratios"):
        rect.rectify(tiny("distilbert"), "movies", ["random"], [0.0], n=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-distilbert-rectify"), "distilbert", "classification", initializer_range=0.2)


def test_cli_sweep_writes_table_curve_and_csv(monkeypatch, capsys, model_dir, tmp_path):
    data = _write_csv(tmp_path / "d.csv", TEXTS, [0, 2] * 5)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        monkeypatch, capsys, "rectify", "--model", model_dir, "--dataset", data, "--split", "all",
        "--method", "leave_one_out,random", "-M", "lime", "--sweep", "--ratios", "0.2,0.5",
        "--option", "lime.n_samples=20", "--out", str(out),
    )
    assert code == 0, stderr
    for name in ("leave_one_out", "random", "lime", "errors fixed", "best r"):
        assert name in stdout
    assert "only those are modified" in stderr
    with open(out / "rectify-tiny-distilbert-rectify0-d.csv", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert [(r["method"], float(r["ratio"])) for r in table] == [
        (m, r) for m in ("leave_one_out", "random", "lime") for r in (0.2, 0.5)
    ]
    assert (out / "rectify-tiny-distilbert-rectify0-d.png").stat().st_size > 1000


def test_cli_errors_are_one_clear_message(monkeypatch, capsys, model_dir):
    code, _, stderr = run_cli(monkeypatch, capsys, "rectify", "--model", model_dir, "--method", "random", "--option", "nonsense=1")
    assert code == 2 and "no method run takes the option 'nonsense'" in stderr
    code, _, stderr = run_cli(monkeypatch, capsys, "rectify", "--model", model_dir, "--method", "no_such_method")
    assert code == 2 and "Traceback" not in stderr


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rectify_runs_on_byte_level_tokenizers(tiny, tmp_path, family):
    """Explanations carry readable tokens (' film') and the tokenizer's own (' Ġfilm'); the
    scores are laid out by the latter, so a byte-level model rectifies as a WordPiece one does --
    fresh and again from its store."""
    model = tiny(family)
    texts = TEXTS[:6]
    predicted = rect.classify(model, texts)
    data = _write_csv(tmp_path / "d.csv", texts, [(int(y) + 1) % 2 for y in predicted])
    expl = model.explain(texts[0], "random")
    assert expl.tokens != expl.raw_tokens  # the case this test is about
    first = rect.rectify(model, data, ["random", "leave_one_out"], [0.5], store=tmp_path / "store")
    again = rect.rectify(model, data, ["random", "leave_one_out"], [0.5], store=tmp_path / "store")
    assert first.n_errors == len(texts) and again.methods["leave_one_out"].from_store == len(texts)
    for name in ("random", "leave_one_out"):
        np.testing.assert_array_equal(first.methods[name].fixed, again.methods[name].fixed)
