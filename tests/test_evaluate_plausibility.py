"""Plausibility metrics against sklearn and hand values; evidence positions on real explanations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.metrics import auc, precision_recall_curve
from sklearn.metrics import average_precision_score as sk_ap

from heedful.datasets import load
from heedful.evaluate import evaluate, get_protocol, model_inputs
from heedful.evaluate.evaluation import ModelInput, considered_positions
from heedful.evaluate.metrics import (
    auprc_score,
    average_precision_rows,
    average_precision_score,
    dot_product_rows,
    dot_product_score,
    hard_rationale,
    iou_score,
    token_f1_score,
)

SCORES = np.array([0.9, -0.2, 0.4, 0.1, 0.7, -0.5])
EVIDENCE = np.array([0, 0, 1, 0, 1, 0], dtype=bool)


def _normxlogit_ap(ranking, cues):
    """The NormXLogit notebook's avg_precision loop (Eq. 11) over a ranking."""
    ap, tp, fp, fn, previous = 0.0, 0, 0, len(cues), 0.0
    for idx in ranking:
        if idx in cues:
            tp, fn = tp + 1, fn - 1
        else:
            fp += 1
        recall = tp / (tp + fn)
        ap += (recall - previous) * tp / (tp + fp)
        previous = recall
    return ap


def test_average_precision_equals_eq_11_and_sklearn():
    expected = _normxlogit_ap(list(np.argsort(-SCORES)), set(np.flatnonzero(EVIDENCE)))
    assert average_precision_score(SCORES, EVIDENCE) == pytest.approx(expected)
    assert expected == pytest.approx(sk_ap(EVIDENCE, SCORES))
    assert expected == pytest.approx((1 / 2 + 2 / 3) / 2)  # ranks 3 and 2 -> hits at 2nd and 3rd


def test_dot_product_normalisations():
    soft = np.exp(SCORES) / np.exp(SCORES).sum()
    assert dot_product_score(SCORES, EVIDENCE) == pytest.approx(soft[EVIDENCE].sum())
    assert dot_product_score(SCORES, EVIDENCE, "l1") == pytest.approx((0.4 + 0.7) / np.abs(SCORES).sum())
    assert dot_product_score(SCORES, EVIDENCE, "none") == pytest.approx(1.1)
    # equal scores (NormXLogit's random baseline): |E| / n
    assert dot_product_score(np.ones(6), EVIDENCE) == pytest.approx(2 / 6)


def test_row_metrics_equal_the_scalar_ones_ties_included():
    """The batched average precision and dot product give, row by row, what sklearn's average
    precision (tied scores: one threshold) and :func:`dot_product_score` give."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(2, 14))
        scores = rng.integers(0, 3, size=(6, n)).astype(float) if trial % 2 else rng.normal(size=(6, n))
        evidence = rng.random(n) < 0.4
        if not evidence.any() or evidence.all():
            continue
        np.testing.assert_allclose(average_precision_rows(scores, evidence), [sk_ap(evidence, row) for row in scores],
                                   rtol=1e-12, atol=1e-12)
        for how in ("softmax", "l1", "none"):
            np.testing.assert_allclose(dot_product_rows(scores, evidence, how),
                                       [dot_product_score(row, evidence, how) for row in scores], rtol=1e-12, atol=1e-12)
    assert np.isnan(average_precision_rows(SCORES[None], np.zeros(6, dtype=bool))).all()
    np.testing.assert_allclose(dot_product_rows(np.zeros((1, 6)), EVIDENCE, "l1"), [0.0])


def test_auprc_f1_iou_as_ferret():
    clipped = np.where(SCORES > 0, SCORES, 0)
    precision, recall, _ = precision_recall_curve(EVIDENCE, clipped)
    assert auprc_score(SCORES, EVIDENCE) == pytest.approx(auc(recall, precision))
    # top-2 positive: positions 0, 4 -> tp 1, precision 1/2, recall 1/2
    assert hard_rationale(SCORES, 2).tolist() == [True, False, False, False, True, False]
    assert token_f1_score(SCORES, EVIDENCE, k=2) == pytest.approx(0.5)
    assert iou_score(SCORES, EVIDENCE, k=2) == pytest.approx(1 / 3)
    # only 4 positive scores exist: top-5 keeps 4
    assert hard_rationale(SCORES, 5).sum() == 4
    assert token_f1_score(-np.abs(SCORES), EVIDENCE) == 0.0 and iou_score(-np.abs(SCORES), EVIDENCE) == 0.0


def test_plausibility_on_explanations_with_user_evidence(tiny, tmp_path):
    model = tiny("bert")
    path = tmp_path / "ev.csv"
    path.write_text("text,label,evidence\na charming and often affecting journey,2,charming\nwhat a waste of a talented cast,0,waste|talented\n")
    data = load(str(path))
    inputs = model_inputs(data, model.adapter)
    expls = model.explain([i.text for i in inputs], "saliency")
    # scores that put everything on the evidence -> perfect alignment
    from heedful.datasets.evidence import token_evidence

    masks = [token_evidence(e.offsets, e.segments, i.evidence_spans) for e, i in zip(expls, inputs, strict=True)]
    perfect = [dataclasses.replace(e, scores=np.where(m, 5.0, -5.0)) for e, m in zip(expls, masks, strict=True)]
    names = ["dot_product", "average_precision", "auprc", "token_f1", "iou"]
    result = evaluate(model, perfect, names, "ferret", inputs)
    assert result["average_precision"].summary.value == pytest.approx(1.0)
    assert result["auprc"].summary.value == pytest.approx(1.0)
    assert result["token_f1"].summary.value == pytest.approx(1.0)
    assert result["dot_product"].summary.value > 0.99
    # and the metric only looks at the positions the protocol considers
    ex = expls[0]
    assert not considered_positions(ex, "exclude", "classification")[[0, -1]].any()
    assert considered_positions(ex, "include", "classification").all()


def test_layerwise_scores_give_a_curve_over_layers(tiny):
    model = tiny("bert")
    expl = model.explain("a charming and often affecting journey", "saliency")
    n = len(expl.tokens)
    layered = dataclasses.replace(expl, scores=np.stack([np.arange(n, dtype=float), -np.arange(n, dtype=float)]))
    inputs = [ModelInput("0", expl.text, None, None, ((0, 2, 10),), -1, float("nan"))]
    result = evaluate(model, [layered], ["average_precision"], get_protocol("normxlogit"), inputs)
    assert result["average_precision"].per_example.curves.shape == (1, 2)
    assert list(result["average_precision"].x) == [1, 2]
    assert result["average_precision"].per_example.values[0] == result["average_precision"].per_example.curves[0, 1]


def test_masked_lm_inputs_shift_evidence_and_skip_multi_token_targets(tiny):
    model = tiny("bert", "masked_lm")
    data = load("agreement", "test", n=60)
    skipped: dict[str, int] = {}
    inputs = model_inputs(data, model.adapter, "gold", skipped)
    assert len(inputs) > 5 and len(inputs) + sum(skipped.values()) == 60
    tok = model.tokenizer
    for item, example in zip(inputs, [e for e in data if e.id in {i.id for i in inputs}], strict=True):
        assert tok.mask_token in item.text
        assert [item.text[s:e] for _, s, e in item.evidence_spans] == list(example.evidence)
        assert item.gold_class == item.target.value
    foils = model_inputs(data, model.adapter, "gold", {}, lm_word="foil")
    by_id = {e.id: e for e in data}
    assert foils
    for item in foils:
        assert item.target.value == tok.convert_tokens_to_ids(by_id[item.id].foil) != item.gold_class
