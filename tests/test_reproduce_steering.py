"""The co-perturbation report's steering section (paper Section 5.4.2): the measures of a
continuation, the claim's verdict, and a quick run on a tiny causal LM end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from heedful.reproduce import coperturbation_steering as section
from heedful.reproduce.coperturbation_steering import TextMeasures, holds, measure


def test_measure_counts_time_and_impact_words_and_repetition():
    m = measure("Since 1990 the effects grew; in recent years the impact was clear. Decades passed.")
    assert m.time_words == 5  # since, 1990, recent, years, decades
    assert m.impact_words == 2
    assert m.distinct_trigrams == 1.0
    loop = measure("it is hot. it is hot. it is hot. it is hot.")
    assert loop.distinct_trigrams == pytest.approx(3 / 10)
    assert measure("too short").distinct_trigrams == 1.0


def test_claim_needs_less_time_more_impact_and_no_loop():
    before = TextMeasures(time_words=3, impact_words=1, distinct_trigrams=0.9, words=40)
    assert holds(before, TextMeasures(1, 2, 0.8, 40))
    assert not holds(before, TextMeasures(3, 2, 0.8, 40))  # time not reduced
    assert not holds(before, TextMeasures(1, 1, 0.8, 40))  # no more impact
    assert not holds(before, TextMeasures(0, 3, 0.2, 40))  # a loop is not coherent
    timeless = TextMeasures(time_words=0, impact_words=0, distinct_trigrams=1.0, words=10)
    assert holds(timeless, TextMeasures(0, 1, 1.0, 9))  # nothing to reduce: none stays none
    assert not holds(timeless, TextMeasures(1, 1, 1.0, 9))


def test_quick_section_on_a_tiny_causal_lm(tmp_path: Path, tiny, monkeypatch):
    lm = tiny("gpt2", "causal_lm")
    monkeypatch.setattr(section, "CASES", (("the movie was dull in recent years", ("in recent years",)),))
    result = section.steering_section(tmp_path, quick=True, load=lambda name: lm)
    assert [f.name for f in result.figures] == ["coperturbation-steering-1.png"]
    assert result.figures[0].stat().st_size > 0
    assert len(result.claims) == 2  # greedy and beam
    assert {verdict for _, verdict, _ in result.claims} <= {"holds", "does not hold"}
    text = "\n".join(result.lines)
    assert "| greedy | original |" in text and "| beam | suppressed |" in text
