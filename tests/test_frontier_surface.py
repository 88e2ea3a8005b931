"""The measured faithfulness-cost frontier where users choose a method: ``heedful methods`` marks
the methods on each task's front, ``GET /api/methods`` carries each method's cost and AOPC, and
the Pareto front of benchmarks/frontier.py is the set no method dominates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from heedful import frontier

ROOT = Path(__file__).resolve().parent.parent
POINTS = {
    "normxlogit": {"cost": 1.0, "aopc": 0.44, "low": 0.41, "high": 0.47, "front": True},
    "attnlrp": {"cost": 3.0, "aopc": 0.60, "low": 0.58, "high": 0.62, "front": True},
    "saliency": {"cost": 3.0, "aopc": 0.30, "low": 0.28, "high": 0.33, "front": False},
    "lime": {"cost": 201.0, "aopc": 0.62, "low": 0.60, "high": 0.64, "front": True},
}


@pytest.fixture
def measured(tmp_path, monkeypatch):
    path = tmp_path / "frontier.json"
    task = {"model": "minilm-sentiment", "examples": 12, "data": "movies test sentences", "protocol": "default", "methods": POINTS}
    path.write_text(json.dumps({"source": "test", "tasks": {"classification": task}}), encoding="utf-8")
    monkeypatch.setattr(frontier, "FRONTIER", path)
    yield path


def test_the_front_is_read_cheapest_first(measured):
    assert frontier.front("classification") == ["normxlogit", "attnlrp", "lime"]
    assert frontier.front("causal_lm") == []
    assert frontier.measured_on("classification") == "minilm-sentiment, 12 movies test sentences"
    assert frontier.row("classification", "lime")["text"] == "≈ 201 forward passes per example; AOPC 0.620 [0.600, 0.640]"
    assert frontier.row("classification", "rollout") is None
    # one pass reads in the singular, as the cost rounds
    assert frontier.row("classification", "normxlogit")["text"] == "≈ 1 forward pass per example; AOPC 0.440 [0.410, 0.470]"


@pytest.mark.parametrize("width", [80, 200])
def test_heedful_methods_marks_the_methods_on_the_front(measured, monkeypatch, capsys, width):
    from heedful.commands.console import out as console

    monkeypatch.setattr(console, "width", width)
    code, out, _ = run_cli(monkeypatch, capsys, "methods")
    assert code == 0
    marked = {line.replace("│", " ").split()[0] for line in out.splitlines() if "★" in line}
    assert marked == {"normxlogit", "attnlrp", "lime"}
    assert "faithfulness-cost front of classification (minilm-sentiment, 12 movies test sentences)" in " ".join(out.split())
    # every column fits the terminal; a method's source shows where there is room for it, else NAME gives it
    assert max(len(line) for line in out.splitlines()) <= width
    assert ("Abbasi et al. 2025" in out) == (width >= 160)
    assert ("heedful methods NAME" in " ".join(out.split())) == (width < 160)


def test_the_methods_api_carries_cost_and_faithfulness(measured, tiny):
    pytest.importorskip("fastapi")
    from heedful.attribution import methods
    from heedful.serve.catalog import method_rows
    from heedful.serve.settings import ServeSettings

    rows = {r["name"]: r for r in method_rows(methods(), "classification", ServeSettings(models=["tiny"]))}
    assert rows["lime"]["faithfulness"]["aopc"] == 0.62 and rows["lime"]["faithfulness"]["front"] is True
    assert rows["saliency"]["faithfulness"]["front"] is False
    assert rows["rollout"]["faithfulness"] is None
    assert all(r["faithfulness"] is None for r in method_rows(methods(), "causal_lm", ServeSettings(models=["tiny"])))


def test_the_pareto_front_is_the_set_no_method_dominates():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from frontier import pareto

    costs = np.array([1.0, 3.0, 3.0, 201.0, 500.0])
    aopc = np.array([0.44, 0.60, 0.30, 0.62, 0.61])
    assert pareto(costs, aopc).tolist() == [True, True, False, True, False]
    # equal cost and faithfulness: neither dominates the other
    assert pareto(np.array([2.0, 2.0]), np.array([0.5, 0.5])).tolist() == [True, True]


def test_the_pareto_front_compares_rows_over_the_sentences_both_have():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from frontier import pareto

    nan = np.nan
    full = np.array([0.9, 0.9, 0.2, 0.2])  # measured on all four sentences: mean 0.55
    part = np.array([0.8, 0.8, nan, nan])  # on the first two, the easy ones: mean 0.80 there
    # by their own means the cheaper partial row would push the full one off; over the
    # sentences both have the full row is the more faithful, so both stay on the front
    assert pareto(np.array([10.0, 5.0]), np.array([full.mean(), np.nanmean(part)])).tolist() == [False, True]
    assert pareto(np.array([10.0, 5.0]), np.stack([full, part])).tolist() == [True, True]
    # and a costlier partial row is beaten where it was measured
    assert pareto(np.array([5.0, 10.0]), np.array([full.mean(), np.nanmean(part)])).tolist() == [True, True]
    assert pareto(np.array([5.0, 10.0]), np.stack([full, part])).tolist() == [True, False]
    # rows that share no sentence do not dominate one another
    apart = np.array([nan, nan, 0.1, 0.1])
    assert pareto(np.array([10.0, 5.0]), np.stack([part, apart])).tolist() == [True, True]


def test_a_row_with_options_marks_its_method_with_them(measured, monkeypatch, capsys):
    from heedful.commands.console import out as console

    task = json.loads(measured.read_text(encoding="utf-8"))
    task["tasks"]["classification"]["methods"]["solvability_beam[objective=both]"] = {
        "cost": 3000.0, "aopc": 0.70, "low": 0.68, "high": 0.72, "front": True, "options": {"objective": "both"}}
    task["tasks"]["classification"]["methods"]["lime[n_samples=400]"] = {
        "cost": 401.0, "aopc": 0.63, "low": 0.61, "high": 0.65, "front": True, "options": {"n_samples": 400}}
    measured.write_text(json.dumps(task), encoding="utf-8")
    frontier._read.cache_clear()
    assert frontier.front("classification")[-1] == "solvability_beam[objective=both]"
    assert frontier.front_marks("classification", "solvability_beam") == ["objective=both"]
    assert frontier.front_marks("classification", "lime") == ["", "n_samples=400"]
    assert frontier.front_marks("classification", "saliency") == []
    assert frontier.row("classification", "solvability_beam") is None  # the page shows a method's defaults
    monkeypatch.setattr(console, "width", 200)
    code, out, _ = run_cli(monkeypatch, capsys, "methods")
    assert code == 0
    rows = {line.replace("│", " ").split()[0]: " ".join(line.replace("│", " ").split()) for line in out.splitlines() if "★" in line}
    assert rows["solvability_beam"].endswith("★ classification (objective=both)")
    assert rows["lime"].endswith("★ classification (defaults; n_samples=400)")
    assert rows["attnlrp"].endswith("★ classification")
    frontier._read.cache_clear()


def test_a_frontier_row_is_a_method_with_its_options():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from frontier_store import labels, split_label

    from heedful.errors import HeedfulError

    assert labels("lime, solvability_beam[objective=both,beam=8],saliency") == ["lime", "solvability_beam[objective=both,beam=8]", "saliency"]
    assert split_label("lime") == ("lime", {})
    assert split_label("solvability_beam[objective=both,beam=8]") == ("solvability_beam", {"objective": "both", "beam": 8})
    with pytest.raises(HeedfulError, match="closing"):
        split_label("solvability_beam[objective=both")
