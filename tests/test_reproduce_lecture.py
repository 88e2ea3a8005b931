"""The lecture report (``heedful reproduce lecture``): end to end on tiny stand-ins of the zoo
models in seconds -- every section, the claims table's structure, verdicts that follow the
toolkit's rules from the numbers in their rows, a rerun that computes nothing, Ctrl-C that
keeps the finished units -- and the statistics it rests on."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from heedful.errors import InputError
from heedful.reproduce import REPORTS, ReportSettings, lecture, report_writer
from heedful.reproduce.lecture import run
from heedful.reproduce.lecture.facts import Fact
from heedful.reproduce.lecture.statistics import (
    expected_layers,
    layer_centre,
    probe_stats,
    text_weights,
)
from heedful.reproduce.toolkit import VERDICTS

TINY = {"n_probe": "10", "n_facts": "2", "n_sweep": "3", "n_vector": "4", "extract_steps": "4", "n_counterfactual": "8",
        "steer_layer": "1", "coefficients": "-8,8", "methods": "saliency"}


@pytest.fixture
def stand_ins(monkeypatch, tiny):
    """The zoo names resolve to tiny seeded models; the factual prompts are ones the tiny LM
    "answers correctly" (its own greedy next token), so the traces run."""
    models = {run.CLASSIFIER: tiny("bert"), run.LM: tiny("llama", "causal_lm")}
    monkeypatch.setattr(run, "load", models.__getitem__)
    monkeypatch.setattr(run, "available", lambda name: None)
    lm = models[run.LM]
    facts = []
    for subject in ("France", "Italy", "Spain", "Peru", "Chile", "Japan", "China", "Egypt", "Greece", "Norway"):
        prompt = f"The capital of {subject} is"
        token = lm.predict(prompt)[0]["index"]
        answer = lm.tokenizer.decode([token])
        if lm.tokenizer(answer, add_special_tokens=False)["input_ids"][:1] == [token] and len(facts) < 3:
            facts.append(Fact("capital", subject, prompt, answer))  # what the tiny LM answers
    assert len(facts) == 3
    facts.append(Fact("capital", "Peru", "The capital of Peru is", "\u00a7never"))
    monkeypatch.setattr(run, "candidate_facts", lambda: facts)
    return models


def _write(tmp_path: Path, **extra: str) -> tuple[Path, str]:
    settings = ReportSettings(quick=True, store=tmp_path / "store", progress=False, options={**TINY, **extra})
    path = lecture.write(tmp_path / "out", settings)
    return path, path.read_text(encoding="utf-8")


CLAIM_ROW = re.compile(r"^\| (.+) \| (.+) \| (.*) \| \*\*([a-z ]+)\*\*(?: \((.+)\))? \|$")


def _claims(text: str) -> list[tuple[str, ...]]:
    section = text.split("## The lecture's claims against this run")[1].split("\n## ")[0]
    return [m.groups() for line in section.splitlines() if (m := CLAIM_ROW.match(line))]


def test_registered():
    assert "lecture" in REPORTS
    assert report_writer("lecture") is lecture.write


def test_bad_options_fail_before_any_work(tmp_path):
    with pytest.raises(InputError, match="no option 'nonsense'"):
        run.plan_of(ReportSettings(options={"nonsense": 1}))
    with pytest.raises(InputError, match="n_facts"):
        run.plan_of(ReportSettings(options={"n_facts": "many"}))
    with pytest.raises(InputError, match="coefficients"):
        run.plan_of(ReportSettings(options={"coefficients": "1,big"}))
    plan = run.plan_of(ReportSettings(store=tmp_path, options={"coefficients": "2,4", "methods": "saliency"}))
    assert plan.coefficients == [0.0, 2.0, 4.0] and plan.methods == ["random", "saliency"]


def test_report_end_to_end_on_tiny_models(stand_ins, tmp_path):
    path, text = _write(tmp_path)
    assert path.name == "lecture-quick.md"
    for heading in ("## 1. Edge probing", "## 2. Causal tracing", "## 3. Steering vectors", "### The lecture's table",
                    "## 4. Counterfactual tests", "## The lecture's claims against this run", "## The lecture's topics here", "## Run"):
        assert heading in text
    for figure in ("probes", "traces", "sweep"):
        assert (path.parent / f"lecture-quick-{figure}.png").stat().st_size > 0
        assert f"(lecture-quick-{figure}.png)" in text
    assert "answers 3 of 4 candidate prompts correctly" in text  # the one it cannot answer is left out
    rows = _claims(text)
    # per probed model: the pipeline claim and two per property; three tracing claims and AtP per kind;
    # extraction and the two table rows, three sweep claims; two edits against random
    assert len(rows) == 2 * 5 + 3 + 2 + 3 + 3 + 2, [r[0][:40] for r in rows]
    for claim, _where, number, word, reason in rows:
        assert word in VERDICTS, (claim, word)
        if word == "cannot be tested here":
            assert reason
            continue
        numbers = re.findall(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]", number)
        if "paired difference" in number or "E[dep] − E[pos] =" in number or number.startswith(("accuracy gain", "selectivity", "MLP − attention", "attention − MLP")):
            estimate, low, high = (float(v) for v in numbers[-1])
            expected = "holds" if low > 0 else "does not hold" if high < 0 else "not separated"
            assert word == expected, (claim, number, word)
    assert "**Interrupted**" not in text


@pytest.mark.slow
def test_rerun_computes_nothing_and_writes_the_same_claims(stand_ins, tmp_path):
    _, first = _write(tmp_path, models=run.CLASSIFIER)
    computed = len(list((tmp_path / "store").glob("*.json")))
    _, second = _write(tmp_path, models=run.CLASSIFIER)
    assert len(list((tmp_path / "store").glob("*.json"))) == computed
    assert "0 units computed" in second
    assert _claims(first) == _claims(second)


@pytest.mark.slow
def test_ctrl_c_writes_what_was_finished_and_keeps_it(stand_ins, tmp_path, monkeypatch):
    real = run.trace_unit
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(lecture, "trace_unit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path, models=run.CLASSIFIER)
    text = (tmp_path / "out" / "lecture-quick.md").read_text(encoding="utf-8")
    assert "**Interrupted**" in text and "## 1. Edge probing" in text
    assert len(list((tmp_path / "store").glob("trace-*.json"))) == 2  # the finished traces were kept
    monkeypatch.setattr(lecture, "trace_unit", real)
    _, text = _write(tmp_path, models=run.CLASSIFIER)
    assert "**Interrupted**" not in text


def test_expected_layer_bootstrap_resamples_texts_and_matches_eq_4():
    from heedful.inside.probing import expected_from

    cumulative = np.array([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=float)  # [Ls, n items]
    layers = [0, 1, 2]
    assert expected_layers(layers, cumulative.mean(axis=1)[None])[0] == pytest.approx(expected_from(layers, cumulative.mean(axis=1))) == 1.5
    weights = text_weights([5, 5, 7, 9], [5, 7, 9])
    assert weights.shape == (1000, 4)
    assert np.array_equal(weights[:, 0], weights[:, 1])  # items of one text move together
    assert np.allclose(weights[:, [0, 2, 3]].sum(axis=1), 3)


def test_probe_stats_of_a_perfect_probe():
    hits = [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    result = {"model": "m", "property": "pos", "majority": 0.5, "scores": [{"layer": i} for i in range(3)],
              "per_item": {"text": [0, 0, 1, 2], "hits": hits, "control_hits": [[0, 0, 0, 0]] * 3, "cumulative_hits": hits}}
    s = probe_stats(result, [0, 1, 2])
    assert s.best == 1 and s.expected == (1.0, 1.0, 1.0)
    assert s.gain == (1.0, 1.0, 1.0) and s.best_selectivity == (1.0, 1.0, 1.0)


def test_layer_centre_weights_positive_effects_only():
    assert layer_centre(np.array([0.0, 1.0, -5.0, 1.0])) == pytest.approx(2.0)
    assert np.isnan(layer_centre(np.array([-1.0, 0.0])))
