"""Mask-LRP report, the mask's readings and ablations: Eq. 10's E_h over the kept heads or over
all heads side by side, and the paper's Table 3 (without positional or syntactic heads) in full."""

from __future__ import annotations

from heedful.reproduce.mask_lrp.run import (
    ALL_HEADS,
    NO_POSITIONAL,
    NO_SYNTACTIC,
    PAPER_TABLE3,
    REFERENCE,
    _DatasetRun,
)
from heedful.reproduce.mask_lrp.statistics import _difference, _excludes_zero, _interval
from heedful.reproduce.toolkit import interval_text


def _heads_mean_section(runs: list[_DatasetRun]) -> list[str]:
    """Eq. 10's ``E_h`` read two ways -- the mean over a block's kept heads (the default, the
    report's "Ours") and over all its heads, the cut ones adding 0 -- side by side, with the paired
    difference and what it says, per run that has both."""
    runs = [r for r in runs if ALL_HEADS in r.variants]
    if not runs:
        return []
    lines = [
        "## E_h over the kept heads or over all heads: a reading of Eq. 10",
        "",
        "Eq. 10 writes Abar_b = E_h (grad A_b ⊙ (R_synt + R_pos))^+ + I without saying over which heads the mean runs "
        "once heads are cut. R_synt + R_pos is 0 on the cut heads, so there are two readings: the mean over block b's "
        "kept heads K_b (`heads_mean=\"kept\"`, heedful's default and the \"Ours\" row above) or over all H heads, the "
        "cut ones adding 0 (`heads_mean=\"all\"`): the same map scaled by |K_b| / H, so after Eq. 11's identity and row "
        "normalisation a block keeping few heads moves the rollout less. A mask of ones gives GAE under both; the "
        "authors' code settles nothing (it averages every head's *unmasked* map). Both readings, paired over the examples:",
        "",
        "| data | AOPC ↑ kept heads [95% CI] | AOPC ↑ all heads [95% CI] | all − kept [95% CI] | LOdds ↓ kept heads | "
        "LOdds ↓ all heads | all − kept [95% CI] | Spearman rho of the token scores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    words = []
    for run in runs:
        da, dl = (_difference(run, ALL_HEADS, "mask_lrp", m) for m in ("aopc", "log_odds"))
        kept_a, all_a = _interval(run, "mask_lrp", "aopc"), _interval(run, ALL_HEADS, "aopc")
        kept_l, all_l = _interval(run, "mask_lrp", "log_odds"), _interval(run, ALL_HEADS, "log_odds")
        rho = run.sensitivity.get("literal: E_h over all heads vs over kept heads", {}).get("spearman", float("nan"))
        lines.append(
            f"| {run.name} | {interval_text(*kept_a)} | {interval_text(*all_a)} | {interval_text(*da, sign=True)} | "
            f"{interval_text(*kept_l)} | {interval_text(*all_l)} | {interval_text(*dl, sign=True)} | {rho:.3f} |"
        )
        moved = [name for name, d in (("AOPC", da), ("LOdds", dl)) if _excludes_zero(d)]
        words.append(
            f"on {run.name} the all-heads reading gives AOPC {all_a[0]:.3f} and LOdds {all_l[0]:.3f} against the kept-heads "
            f"reading's {kept_a[0]:.3f} and {kept_l[0]:.3f} — "
            + (f"the reading changes the result (the paired interval of the difference excludes 0 for {' and '.join(moved)})"
               if moved else "the two readings are not told apart at this n (both paired intervals of the difference include 0)")
        )
    lines += ["", "In words: E_h over the kept heads or over all heads is a reading of the paper, not something it states; "
              + "; ".join(words) + ".", ""]
    return lines


def _table3_section(runs: list[_DatasetRun]) -> list[str]:
    """The paper's Table 3 in full: Mask-LRP with the whole mask, without its positional heads and
    without its syntactic heads, AOPC and LOdds with 95 % intervals and the paired difference from
    the whole mask, per run where the ablations ran, beside the paper's SST-2 and QQP numbers."""
    runs = [r for r in runs if NO_POSITIONAL in r.variants or NO_SYNTACTIC in r.variants]
    lines = ["## Table 3: without positional or without syntactic heads", ""]
    if not runs:
        return lines + ["Not run: the head mask carries no breakdown into positional and syntactic heads.", ""]
    lines += [
        "Mask-LRP (Eq. 10 as written) with the selected mask M = M_synt ∪ M_pos, with M_synt alone (\"w/o M_pos\") "
        "and with M_pos alone (\"w/o M_synt\"); a head both syntactic and positional stays in either. Differences "
        "from the whole mask are paired over the examples (95 % bootstrap intervals, 1000 resamples). The paper "
        "(BERT-base) gives no intervals; its differences are computed from its rounded values.",
        "",
        "| data | row | heads kept | AOPC ↑ [95% CI] | − Ours [95% CI] | LOdds ↓ [95% CI] | − Ours [95% CI] | "
        "paper SST-2 AOPC / LOdds (− Ours) | paper QQP AOPC / LOdds (− Ours) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    full = PAPER_TABLE3["Ours"]
    for run in runs:
        for label, row in (("mask_lrp", "Ours"), (NO_POSITIONAL, "Ours w/o M_pos"), (NO_SYNTACTIC, "Ours w/o M_synt")):
            if label != "mask_lrp" and label not in run.variants:
                continue
            heads = run.variants[REFERENCE if label == "mask_lrp" else label].kept  # the reference run: the same mask
            kept = f"{heads:.0f}" if heads == heads else "–"
            diffs = ["–", "–"] if label == "mask_lrp" else [
                interval_text(*_difference(run, label, "mask_lrp", m), 4, sign=True) for m in ("aopc", "log_odds")
            ]
            paper = []
            for col in ("SST-2", "QQP"):
                a, lo = PAPER_TABLE3[row][col]
                paper.append(f"{a:.3f} / {lo:.3f}" + ("" if row == "Ours" else f" ({a - full[col][0]:+.3f} / {lo - full[col][1]:+.3f})"))
            lines.append(
                f"| {run.name} | {row} | {kept} | {interval_text(*_interval(run, label, 'aopc'), 4)} | {diffs[0]} | "
                f"{interval_text(*_interval(run, label, 'log_odds'), 4)} | {diffs[1]} | {paper[0]} | {paper[1]} |"
            )
    lines += ["", "The verdict on the paper's reading (\"eliminating one type of mask doesn't substantially impact the "
              "explanation performance\") is in the claims table.", ""]
    return lines
