"""benchmarks/frontier.py keeps every method's explanations and metric values in a results store
as they finish: a second run computes no explanation, Ctrl-C keeps the finished methods and writes
no report, ``--share`` splits the methods between processes, and ``--report-only`` states the
sentences each method reached. On a tiny seeded model, a six-review CSV and a dictionary tagger
for the sampled-replacement operator."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_reviews
from test_evaluate_operators import dictionary_tagger  # noqa: F401  (a fixture, used below)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import frontier  # noqa: E402

pytestmark = pytest.mark.usefixtures("dictionary_tagger")


@pytest.fixture
def setting(tmp_path, monkeypatch, tiny):
    """The frontier on the tiny BERT (``tiny-bert``, six reviews, its F-Fidelity copy the same
    weights); returns the model, a counter of the methods it explained with, and the
    command-line arguments every run shares."""
    model = tiny("bert")
    calls: Counter = Counter()
    explain = model.explain

    def counted(texts, method, *args, **kwargs):
        calls[method] += 1
        return explain(texts, method, *args, **kwargs)

    monkeypatch.setattr(model, "explain", counted)
    monkeypatch.setattr(frontier, "MODELS", {"tiny-bert": 6})
    monkeypatch.setattr(frontier, "FFIDELITY", {"tiny-bert": "tiny-bert-ffidelity"})
    monkeypatch.setattr(frontier, "load_model", lambda name: model)
    monkeypatch.setattr(frontier, "is_built", lambda name: True)
    monkeypatch.setattr(frontier, "DATASET", write_reviews(tmp_path / "reviews.csv"))
    monkeypatch.setattr(frontier, "write_results", lambda path, text: path.write_text(text, encoding="utf-8"))
    base = ["--store", str(tmp_path / "store"), "--out", str(tmp_path / "frontier.md"), "--front", str(tmp_path / "frontier.json"),
            "--threads", "1", "--batch-size", "4", "--samples", "2", "--progress", "never"]
    return model, calls, base


def _rows(path: Path) -> dict[str, str]:
    """The report's table rows by method."""
    return {line.split("`")[1]: line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| `")}


def test_a_second_run_computes_no_explanation_and_writes_the_same_table(setting, tmp_path):
    _, calls, base = setting
    args = [*base, "--methods", "saliency,random"]
    assert frontier.main(args) == 0
    assert set(calls) == {"saliency", "random"}
    first = _rows(tmp_path / "frontier.md")
    assert set(first) == {"saliency", "random"}
    assert "FFid+" in (tmp_path / "frontier.md").read_text(encoding="utf-8")
    calls.clear()
    (tmp_path / "frontier.md").unlink()
    assert frontier.main(args) == 0
    assert not calls  # every explanation and value came from the store
    assert _rows(tmp_path / "frontier.md") == first


def test_an_interrupted_run_keeps_the_finished_methods_and_writes_no_report(setting, tmp_path, monkeypatch, capsys):
    model, calls, base = setting
    counted = model.explain

    def stopped(texts, method, *args, **kwargs):
        if method == "saliency":  # run after random (cheaper by its cost model)
            raise KeyboardInterrupt
        return counted(texts, method, *args, **kwargs)

    monkeypatch.setattr(model, "explain", stopped)
    args = [*base, "--methods", "saliency,random"]
    assert frontier.main(args) == 130
    assert calls["random"] > 0
    assert not (tmp_path / "frontier.md").exists() and not (tmp_path / "frontier.json").exists()
    err = capsys.readouterr().err
    assert "interrupted: kept 0 of 6 examples of saliency" in err and "nothing was written to" in err
    monkeypatch.setattr(model, "explain", counted)
    calls.clear()
    assert frontier.main(args) == 0
    assert set(calls) == {"saliency"}  # random was kept whole: not explained again
    assert set(_rows(tmp_path / "frontier.md")) == {"saliency", "random"}


def test_shares_split_the_methods_and_the_report_comes_from_the_store(setting, tmp_path):
    _, calls, base = setting
    methods = ["--methods", "saliency,random,grad_x_input"]
    assert frontier.main([*base, *methods, "--share", "0/2"]) == 0
    assert set(calls) == {"random", "saliency"}  # cheapest first: random, grad_x_input, saliency -> 0 and 2
    assert not (tmp_path / "frontier.md").exists()  # a share writes no report
    calls.clear()
    assert frontier.main([*base, *methods, "--share", "1/2"]) == 0
    assert set(calls) == {"grad_x_input"}
    calls.clear()
    assert frontier.main([*base, *methods, "--report-only"]) == 0
    assert not calls
    assert set(_rows(tmp_path / "frontier.md")) == {"saliency", "random", "grad_x_input"}


def test_the_report_from_the_store_states_the_sizes_reached(setting, tmp_path):
    _, calls, base = setting
    assert frontier.main([*base, "--methods", "random"]) == 0
    assert frontier.main([*base, "--methods", "saliency", "--n", "3"]) == 0
    calls.clear()
    assert frontier.main([*base, "--methods", "random,saliency", "--report-only"]) == 0
    assert not calls
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    rows = _rows(tmp_path / "frontier.md")
    assert "| **3 of 6** |" in rows["saliency"] and "| 6 |" in rows["random"]
    assert "Sentences reached: all 6 by 1 of 2 methods; fewer by (bold in the table, scored on the sentences they have): `saliency` 3." in text
    assert "from the results store as it stood" in text
    methods = json.loads((tmp_path / "frontier.json").read_text(encoding="utf-8"))["tasks"]["classification"]["methods"]
    assert methods["saliency"]["examples"] == 3 and "examples" not in methods["random"]


def test_a_report_from_an_empty_store_writes_nothing(setting, tmp_path):
    _, calls, base = setting
    assert frontier.main([*base, "--methods", "random", "--report-only"]) == 2
    assert not (tmp_path / "frontier.md").exists() and not calls
