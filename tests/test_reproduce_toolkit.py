"""The reproduce toolkit: every verdict function gives the right word for every outcome, and the
paired bootstrap interval is the plain loop's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heedful.evaluate.intervals import (
    bootstrap_indices,
    bootstrap_mean,
    bootstrap_paired_difference,
)
from heedful.reproduce.toolkit import (
    CANNOT_BE_TESTED,
    DOES_NOT_HOLD,
    HOLDS,
    LEGEND,
    NOT_COMPARABLE,
    NOT_SEPARATED,
    VERDICTS,
    WRONG_DIRECTION,
    Verdict,
    all_of,
    difference_verdict,
    interval_text,
    interval_verdict,
    paired_verdict,
    spearman,
)

# (estimate, low, high) of "A", of "B" and of A - B for each outcome of the claim "A is ahead of B"
HIGH, LOW, NEAR_HIGH = (0.8, 0.75, 0.85), (0.5, 0.45, 0.55), (0.78, 0.7, 0.82)
CASES = {
    "apart, right direction": (HIGH, LOW, (0.3, 0.2, 0.4), Verdict(HOLDS)),
    "apart, wrong direction": (LOW, HIGH, (-0.3, -0.4, -0.2), Verdict(DOES_NOT_HOLD)),
    "overlapping, right direction": (HIGH, NEAR_HIGH, (0.02, -0.01, 0.05), Verdict(NOT_SEPARATED)),
    "overlapping, wrong direction": (NEAR_HIGH, HIGH, (-0.02, -0.05, 0.01), Verdict(NOT_SEPARATED, WRONG_DIRECTION)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_interval_and_difference_verdicts_give_each_outcome_its_word(case):
    a, b, d, expected = CASES[case]
    assert interval_verdict(a, b) == expected
    assert difference_verdict(d) == expected
    flip = lambda iv: tuple(-v for v in iv)  # noqa: E731 -- the same claim on a lower-is-better metric
    assert interval_verdict(flip(a), flip(b), higher_is_better=False) == expected
    assert difference_verdict(flip(d), higher_is_better=False) == expected


@pytest.mark.parametrize("case", list(CASES))
def test_a_population_or_a_missing_input_overrides_the_numbers(case):
    a, b, d, _ = CASES[case]
    why = "the paper's error set is the intersection of its models' errors"
    for got in (interval_verdict(a, b, not_comparable=why), difference_verdict(d, not_comparable=why)):
        assert got == Verdict(NOT_COMPARABLE, why) and str(got) == f"not comparable ({why})"
    for got in (interval_verdict(a, b, missing="no NLI data"), difference_verdict(d, missing="no NLI data")):
        assert got == Verdict(CANNOT_BE_TESTED, "no NLI data")
    nan = (math.nan, math.nan, math.nan)
    assert interval_verdict(a, nan).word == CANNOT_BE_TESTED and difference_verdict(nan).word == CANNOT_BE_TESTED


def test_paired_verdict_separates_what_marginal_intervals_cannot():
    rng = np.random.default_rng(3)
    difficulty = rng.normal(0, 1, 200)  # shared by both methods: cancels in the paired difference
    a, b = difficulty + 0.1 + rng.normal(0, 0.05, 200), difficulty + rng.normal(0, 0.05, 200)
    marginal = [bootstrap_mean(x) for x in (a, b)]
    assert interval_verdict(*marginal) == Verdict(NOT_SEPARATED)
    verdict, d = paired_verdict(a, b)
    assert verdict == Verdict(HOLDS) and d[1] > 0
    assert paired_verdict(b, a)[0] == Verdict(DOES_NOT_HOLD)
    assert paired_verdict(a, a + rng.normal(0, 0.05, 200))[0].word == NOT_SEPARATED
    assert difference_verdict((0.0, -0.1, 0.1)) == Verdict(NOT_SEPARATED)  # no direction: not the wrong one
    assert paired_verdict(a, b, not_comparable="other protocol")[0].word == NOT_COMPARABLE
    assert paired_verdict(a, b, missing="no checkpoint")[0].word == CANNOT_BE_TESTED


def test_paired_bootstrap_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.2, 37), rng.normal(0.4, 0.2, 37)
    a[5], b[9] = math.nan, math.inf  # left out with their partner
    keep = [i for i in range(37) if math.isfinite(a[i]) and math.isfinite(b[i])]
    pairs = [(a[i], b[i]) for i in keep]
    rows = bootstrap_indices(len(pairs), n_boot=500, seed=7)  # the seeded resamples of every interval
    means = []
    for row in rows:
        total = 0.0
        for i in row:
            x, y = pairs[int(i)]
            total += x - y
        means.append(total / len(row))
    expected = (sum(x - y for x, y in pairs) / len(pairs), *np.percentile(means, [2.5, 97.5]))
    got = bootstrap_paired_difference(a, b, n_boot=500, seed=7)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="shape"):
        bootstrap_paired_difference(a, b[:-1])


def test_all_of_needs_every_part():
    held, apart_wrong, close = Verdict(HOLDS), Verdict(DOES_NOT_HOLD), Verdict(NOT_SEPARATED)
    assert all_of([held, held]) == held
    assert all_of([held, close]) == close
    assert all_of([held, Verdict(NOT_SEPARATED, WRONG_DIRECTION)]) == Verdict(NOT_SEPARATED, WRONG_DIRECTION)
    assert all_of([close, apart_wrong]) == apart_wrong
    assert all_of([held, Verdict(NOT_COMPARABLE, "x")]) == Verdict(NOT_COMPARABLE, "x")
    assert all_of([apart_wrong, Verdict(CANNOT_BE_TESTED, "y")]) == Verdict(CANNOT_BE_TESTED, "y")
    with pytest.raises(ValueError, match="unknown verdict"):
        Verdict("mixed")


def test_legend_names_the_five_words_and_helpers():
    assert all(f"**{word}**" in LEGEND for word in VERDICTS) and len(VERDICTS) == 5
    assert interval_text(0.8123, 0.78, 0.844) == "0.812 [0.780, 0.844]"
    assert interval_text(0.01, -0.002, 0.02, sign=True) == "+0.010 [-0.002, +0.020]"
    assert interval_text(0.25, 0.2, 0.3, std=0.008) == "0.250 ± 0.008 [0.200, 0.300]"
    assert interval_text(0.5, math.nan, math.nan, 2) == "0.50" and interval_text(math.nan, 0, 1) == "–"
    # a bound that is not 0 never prints as 0: the side of 0 a verdict reads shows
    assert interval_text(0.0004, 0.0001, 0.0007, sign=True) == "+0.0004 [+0.0001, +0.0007]"
    assert interval_text(0.0, 0.0, 0.001) == "0.000 [0.000, 0.001]"  # an exact 0 keeps the digits
    assert interval_text(2e-9, -1e-9, 3e-9, sign=True) == "+0.000000 [-0.000000, +0.000000]"  # at most 6 digits
    assert spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1.0], [2.0]))


def test_bench_difference_pairs_the_stored_per_example_values(tiny, tmp_path):
    import csv

    from heedful.evaluate import ResultsStore, get_protocol
    from heedful.evaluate.bench import BenchSpec, per_example_from_store, run_bench
    from heedful.reproduce.toolkit import bench_difference

    data = tmp_path / "d.csv"
    with open(data, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), ("a charming and often affecting journey", "POSITIVE"),
                                  ("the movie was dull and far too long", "NEGATIVE"), ("what a waste of a talented cast", "NEGATIVE"),
                                  ("an intelligent , funny and moving film", "POSITIVE")])
    protocol = get_protocol("normxlogit", random_seeds=2)
    result = run_bench(BenchSpec(model=tiny("bert"), dataset=str(data), methods=["random", "saliency"], metrics=["aopc"],
                                 protocol=protocol, out=tmp_path / "store", batch_size=2, model_label="tiny-bert"), progress=False)
    assert len(result.ids) == result.n_examples == 4
    with ResultsStore(result.store_path) as store:
        per = {r.key: per_example_from_store(store, r.key, "aopc", protocol.hash(), result.ids).values for r in result.runs}
    saliency = next(per[r.key] for r in result.runs if r.group == "saliency")
    random = np.mean([per[r.key] for r in result.runs if r.group == "random"], axis=0)  # the mean over the seeds
    assert bench_difference(result, "saliency", "random", "aopc") == pytest.approx(bootstrap_paired_difference(saliency, random))
    assert bench_difference(result, "saliency", "random", "aopc")[0] == pytest.approx(
        result.groups["saliency"].summaries["aopc"].value - result.groups["random"].summaries["aopc"].value)
    assert all(math.isnan(v) for v in bench_difference(result, "saliency", "lime", "aopc"))  # a row the bench has not


def _every_verdict_function():
    """Each verdict function of the toolkit with its inputs for every outcome of its claim:
    (apart, right direction), (apart, wrong direction), (overlapping) -> the word expected."""
    from heedful.reproduce.toolkit import (
        count_verdict,
        equivalence_verdict,
        exact_verdict,
        threshold_verdict,
    )

    rng = np.random.default_rng(5)
    shared = rng.normal(0, 1, 120)
    ahead, behind = shared + 0.5 + rng.normal(0, 0.05, 120), shared + rng.normal(0, 0.05, 120)
    return {
        "difference_verdict": (difference_verdict, {
            HOLDS: ((0.3, 0.2, 0.4),), DOES_NOT_HOLD: ((-0.3, -0.4, -0.2),), NOT_SEPARATED: ((0.02, -0.01, 0.05),)}),
        "interval_verdict": (interval_verdict, {
            HOLDS: (HIGH, LOW), DOES_NOT_HOLD: (LOW, HIGH), NOT_SEPARATED: (HIGH, NEAR_HIGH)}),
        "paired_verdict": (lambda *a, **k: paired_verdict(*a, **k)[0], {
            HOLDS: (ahead, behind), DOES_NOT_HOLD: (behind, ahead), NOT_SEPARATED: (ahead, ahead + rng.normal(0, 0.05, 120))}),
        "threshold_verdict": (threshold_verdict, {
            HOLDS: ((0.9, 0.85, 0.95), 0.8), DOES_NOT_HOLD: ((0.7, 0.65, 0.75), 0.8), NOT_SEPARATED: ((0.81, 0.75, 0.87), 0.8)}),
        "equivalence_verdict": (equivalence_verdict, {
            HOLDS: ((0.001, -0.004, 0.006), 0.01), DOES_NOT_HOLD: ((-0.05, -0.07, -0.03), 0.01),
            NOT_SEPARATED: ((0.008, -0.002, 0.018), 0.01)}),
        "count_verdict": (count_verdict, {HOLDS: (29, 30, 30), DOES_NOT_HOLD: (3, 10, 30), NOT_SEPARATED: (12, 27, 30)}),
        "exact_verdict": (exact_verdict, {HOLDS: (True,), DOES_NOT_HOLD: (False,)}),
    }


@pytest.mark.parametrize("name", list(_every_verdict_function()))
def test_every_verdict_function_gives_every_outcome_its_word(name):
    fn, outcomes = _every_verdict_function()[name]
    for word, args in outcomes.items():
        assert fn(*args).word == word, (name, word, args)
        why = "the paper's error set is the intersection of its models' errors"
        assert fn(*args, not_comparable=why) == Verdict(NOT_COMPARABLE, why)  # another population
        assert fn(*args, missing="no NLI data") == Verdict(CANNOT_BE_TESTED, "no NLI data")


def test_threshold_and_count_verdicts_read_the_direction_they_are_given():
    from heedful.reproduce.toolkit import count_verdict, threshold_verdict, untestable

    assert threshold_verdict((0.3, 0.2, 0.4), 0.5, above=False) == Verdict(HOLDS)  # under half: the claim "below"
    assert threshold_verdict((0.6, 0.55, 0.65), 0.5, above=False) == Verdict(DOES_NOT_HOLD)
    assert threshold_verdict((0.45, 0.4, 0.55), 0.5) == Verdict(NOT_SEPARATED, WRONG_DIRECTION)
    assert count_verdict(0, 0, 0).word == CANNOT_BE_TESTED and count_verdict(8, 8, 10, share=0.8) == Verdict(HOLDS)
    assert untestable("no QA data") == Verdict(CANNOT_BE_TESTED, "no QA data")


def test_coverage_lists_name_the_papers_rows_with_a_status_each():
    from heedful.reproduce.coperturbation.markdown import PAPER_EXPERIMENTS as COPERTURBATION
    from heedful.reproduce.mask_lrp.markdown import PAPER_EXPERIMENTS as MASK_LRP
    from heedful.reproduce.normxlogit.markdown import PAPER_EXPERIMENTS as NORMXLOGIT
    from heedful.reproduce.toolkit import coverage_section

    for entries in (COPERTURBATION, MASK_LRP, NORMXLOGIT):
        lines = coverage_section(entries)
        assert len(lines) == len(entries) + 5 and all(how for _, _, how in entries)
    named = {report: " ".join(what for what, _, _ in entries) for report, entries in
             (("coperturbation", COPERTURBATION), ("mask-lrp", MASK_LRP))}
    for needle in ("QNLI and QQP", "Figure 3a", "Figure 3b on OPT", "Table 2", "Figure 8", "Figure 9"):
        assert needle in named["coperturbation"], needle
    for needle in ("Table 1", "Table 2", "Table 3", "Table 4", "Figure 3", "Figure 4", "Figure 5", "Figure 6", "Appendix"):
        assert needle in named["mask-lrp"], needle
    with pytest.raises(ValueError, match="not one of"):
        coverage_section([("Figure 1", "partly", "x")])
    assert coverage_section([("Table 5", "analogue (time only)", "x")])[-2] == "| Table 5 | analogue (time only) | x |"
