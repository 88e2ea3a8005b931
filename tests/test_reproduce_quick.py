"""Every ``heedful reproduce`` report, as a user runs it, in quick mode on the zoo models: a
handful of examples, a temporary results store. Each report must have its sections, and a rerun
with the same store must compute nothing the store holds: no explanation, perturbation
measurement or metric is written again.

minilm-sentiment is assembled from its shipped weights when missing (seconds); the parts on
``smollm2-135m`` (co-perturbation's steering section, NormXLogit's Experiment 2) need it built --
``.ci/run`` builds it before the suite -- and the test skips without it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from heedful.evaluate.store import ResultsStore
from heedful.lrp.masks import HeadMask


@pytest.fixture(scope="module")
def zoo_ready():
    from heedful import zoo

    zoo.ensure_built("minilm-sentiment", progress=False)
    if not zoo.is_built("smollm2-135m"):
        pytest.skip("smollm2-135m is not built (heedful models build smollm2-135m; .ci/run builds it)")


@pytest.fixture
def writes(monkeypatch) -> Counter:
    """Rows written to the results store, by table (every put_* goes through ``_insert``)."""
    counts: Counter = Counter()
    original = ResultsStore._insert

    def counting(self, table, key, rows):
        counts[table] += len(rows)
        return original(self, table, key, rows)

    monkeypatch.setattr(ResultsStore, "_insert", counting)
    return counts


def _reproduce(name: str, out: Path, store: Path, n: int | None, **options: object) -> str:
    """``heedful reproduce NAME --quick`` through the command line; the report's text."""
    from heedful.cli import app

    args = ["reproduce", name, "--quick", "--out", str(out), "--store", str(store)]
    args += ["--n", str(n)] if n is not None else []
    for key, value in options.items():
        args += ["--option", f"{key}={value}"]
    done = CliRunner().invoke(app, args, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    reports = [p for p in out.glob("*.md")]
    assert len(reports) == 1, reports
    return reports[0].read_text(encoding="utf-8")


def _twice(name: str, tmp_path: Path, writes: Counter, n: int | None, **options: object) -> tuple[str, str]:
    """Run a report, then again with the same store: the second run writes nothing to it."""
    store = tmp_path / "store"
    first = _reproduce(name, tmp_path / "first", store, n, **options)
    assert writes["explanations"] > 0 and writes["metrics"] > 0, dict(writes)  # computed and stored
    writes.clear()
    second = _reproduce(name, tmp_path / "second", store, n, **options)
    assert writes["explanations"] == 0 and writes["measurements"] == 0 and writes["metrics"] == 0, dict(writes)
    return first, second


@pytest.mark.slow  # about 90 s on 2 cores (every method of the report on MiniLM, twice): run with -m slow
def test_mask_lrp_quick_report_and_rerun(zoo_ready, tmp_path: Path, writes: Counter):
    mask = HeadMask.from_array(np.eye(6, 12, dtype=int), {"model": "minilm-sentiment", "dataset": "movies"})
    first, second = _twice(
        "mask-lrp", tmp_path, writes, 3,
        head_mask=mask.save(tmp_path / "mask.json"), datasets="movies", mask_seeds=2, random_seeds=2,
        ig_steps=2, planted_model="none",  # the planted section: tests/test_reproduce_mask_lrp.py, tiny decoder
        deep_model="none",  # the deeper classifier's section: tests/test_reproduce_mask_lrp.py, tiny Llama classifier
    )
    for text in (first, second):
        assert "smoke run" in text and "n = 3" in text and "Table 1 analogue" in text
        assert "Ours (Mask-LRP)" in text and "6 of 72 heads kept" in text
        assert "## E_h over the kept heads or over all heads: a reading of Eq. 10" in text and "## Table 3: without" in text
        assert "## Headline ordering with 95 % bootstrap intervals" in text
        assert "## Claims of the paper against this run" in text
    assert sorted(p.name for p in (tmp_path / "second").glob("*.png")) == sorted(
        p.name for p in (tmp_path / "first").glob("*.png")
    )


@pytest.mark.slow  # about 80 s on 2 cores (both zoo models, Experiment 2, timing): run with -m slow
def test_normxlogit_quick_report_and_rerun(zoo_ready, tmp_path: Path, writes: Counter):
    first, second = _twice(
        "normxlogit", tmp_path, writes, 3, ig_steps=2, ig_steps_decoder=2, n_agreement=6, random_seeds=2,
        n_regression=3,
    )
    for text in (first, second):
        assert "Quick smoke run" in text and "## Experiment 1: faithfulness" in text
        assert "### minilm-sentiment" in text and "Ordering by aopc" in text and "| DecompX | " in text
        assert "## Experiment 2 analogue: layer-wise evidence alignment" in text
        assert "### Without the anchor position" in text and "tested without the anchor position" in text
        assert "## Cost: the paper's Tables 4-5" in text and "## Run" in text
    assert (tmp_path / "second" / "normxlogit-quick-minilm-sentiment-aopc.png").is_file()
    assert (tmp_path / "second" / "normxlogit-quick-alignment.png").is_file()


@pytest.mark.slow  # about 5 min on 2 cores (the optimised solver, steering on SmolLM2): run with -m slow
def test_coperturbation_quick_report_with_steering_and_rerun(zoo_ready, tmp_path: Path, writes: Counter):
    first, second = _twice(
        "coperturbation", tmp_path, writes, None, models="minilm-sentiment", n_bench=3, n_compare=3, n_study=2,
        n_rectify=12, check=1,
    )
    for text in (first, second):
        assert text.startswith("# ") and "smollm2-sentiment" in text  # the model left out is named
        assert "## 8. Steering generation by suppressing prompt words" in text
    assert sorted(p.name for p in (tmp_path / "second").glob("*.png")) == sorted(
        p.name for p in (tmp_path / "first").glob("*.png")
    )
