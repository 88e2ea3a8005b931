"""NormXLogit report, the paper's claims: every claim with this run's number and its verdict from
the toolkit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from heedful.evaluate.report import fmt
from heedful.reproduce.normxlogit.markdown import alignment_cell
from heedful.reproduce.normxlogit.run import (
    DECODER_CLASSIFIER,
    EXP2_METHODS,
    EXP2_NAMES,
    GRADIENT_METHODS,
    GRADIENT_ROWS,
    NAMES,
    TIMING_METHODS,
    Alignment,
    Timing,
)
from heedful.reproduce.normxlogit.statistics import layers_ahead, ordering
from heedful.reproduce.toolkit import (
    HOLDS,
    LEGEND,
    Verdict,
    all_of,
    bench_curve_differences,
    bench_difference,
    count_verdict,
    difference_verdict,
    exact_verdict,
    interval_text,
    interval_verdict,
    summary_text,
    summary_verdict,
    untestable,
)

# ---------------------------------------------------------------------------- claims
SIGNED_NOT_COMPARABLE = "the paper's gradient rows are L1-aggregated; it never ran signed sums"


def _headline(result: Any) -> str:
    return "pearson" if result.task == "regression" else "aopc"


def _cell(result: Any, key: str, metric: str) -> str:
    return f"{NAMES[key]} {summary_text(result.groups[key].summaries[metric], result.groups[key].seeds)}"


def _versus(result: Any, metric: str, where: str, claim: str, a: str, b: str, prefix: str = "",
            not_comparable: str | None = None) -> tuple[str, str, str, Verdict]:
    """The claim "``a`` is ahead of ``b``" on ``metric``: (claim, where, both cells and their paired
    difference, verdict)."""
    from heedful.evaluate.metrics import METRICS

    sa, sb = result.groups[a].summaries[metric], result.groups[b].summaries[metric]
    difference = bench_difference(result, a, b, metric)
    number = f"{_cell(result, a, metric)} vs {prefix}{_cell(result, b, metric)}"
    if all(math.isfinite(v) for v in difference):
        number += f"; paired difference {interval_text(*difference, sign=True)}"
    return claim, where, number, summary_verdict(sa, sb, METRICS[metric].higher_is_better, difference, not_comparable=not_comparable)


def _claims_exp1(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(claim, where, our number, verdict) of Experiment 1's claims on every case that ran."""
    from heedful.evaluate.metrics import METRICS

    rows: list[tuple[str, str, str, str]] = []
    for key, result in results.items():
        metric = _headline(result)
        higher = METRICS[metric].higher_is_better
        s = {k: g.summaries[metric] for k, g in result.groups.items()}
        where = f"`{key}`, {metric}"
        grads = [k for k in GRADIENT_ROWS if k in s]
        l1 = [k for k in GRADIENT_METHODS if k in s]
        signed = [k for k in GRADIENT_ROWS if k in s and k not in GRADIENT_METHODS]
        vs = [
            ("NormXLogit is more faithful than the gradient-based methods (abstract, §4.2, conclusion)",
             "normxlogit", ordering({k: s[k].value for k in l1}, higher)[0], "best L1 gradient row (the paper's) "),
        ]
        if signed:
            vs.append(("… against the signed-sum gradient rows (not the paper's)", "normxlogit",
                       ordering({k: s[k].value for k in signed}, higher)[0], "best signed gradient row ",
                       SIGNED_NOT_COMPARABLE))
        vs += [
            ("Weighting LogAt by the embedding norm makes it more faithful (§3.4)", "normxlogit", "logat", ""),
            ("The norm of the word embeddings identifies important tokens (§3.2; better than random)",
             "embedding_norm", "random", ""),
        ]
        if key == "minilm-sentiment" and "decompx" in s:
            vs.append(("On SST-2 (BERT) the architecture-specific DecompX is ahead of NormXLogit (§4.2, Table 1)",
                       "decompx", "normxlogit", ""))
        if result.task == "regression" and "decompx" in s:
            vs.append(("Regression: NormXLogit is ahead of the architecture-specific DecompX (§1, §4.2)",
                       "normxlogit", "decompx", ""))
            vs.append(("Regression (BERT): the embedding norm alone is ahead of DecompX (§4.2)", "embedding_norm", "decompx", ""))
        if result.task == "regression" and "normxlogit_far" in s:
            vs.append(("Eq. 8 as printed (largest distance from the prediction first) ranks important tokens "
                       "(better than random)", "normxlogit_far", "random", ""))
        rows += [_versus(result, metric, where, *claim) for claim in vs]
        if key == DECODER_CLASSIFIER:
            rows.append(_every_ratio(result, metric, where, [*grads, "random"]))
    return rows


def _every_ratio(result: Any, metric: str, where: str, others: list[str]) -> tuple[str, str, str, Verdict]:
    """Llama 2's "ahead at every perturbation ratio" claim: at each ratio that enters the mean, the
    paired interval of NormXLogit − each other row over the examples (the stored curves)."""
    from heedful.evaluate.metrics import METRICS

    higher = METRICS[metric].higher_is_better
    points = np.flatnonzero(result.spec.protocol.mean_mask)
    diffs = {k: bench_curve_differences(result, "normxlogit", k, metric) for k in others}
    claim = ("Llama 2: NormXLogit has a higher AOPC than the gradient methods and random at every perturbation ratio "
             "(§4.2, Figure 2; tested at every ratio)")
    if not points.size or any(d.shape[0] <= points.max() for d in diffs.values()):
        return claim, where, "–", count_verdict(0, 0, len(points), missing="no per-example curves in the results store")
    sign = 1.0 if higher else -1.0
    ahead = sum(all(sign * diffs[k][j, 0] > 0 for k in others) for j in points)
    apart = sum(all(difference_verdict(diffs[k][j], higher).word == HOLDS for k in others) for j in points)
    closest = min(sign * diffs[k][j, 1 if higher else 2] for k in others for j in points)
    return (claim, where, f"ahead of all {len(others)} at {ahead} of {len(points)} ratios, paired intervals apart at "
            f"{apart} (the smallest paired lower bound {closest:+.3f})",
            count_verdict(apart, ahead, len(points), share=1.0))


def _claims_cost(results: dict[str, Any], timing: Timing | None) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    first = next(iter(results.values()), None)
    if first is not None:
        cost = first.groups["normxlogit"].cost
        ok = cost["backward"] == 0 and cost["forward"] <= 1.0
        rows.append(("NormXLogit needs a single forward pass and no backward pass (§4.2)",
                     f"`{first.model_name}`, Experiment 1",
                     f"{fmt(cost['forward'], digits=2)} forward and {fmt(cost['backward'], digits=2)} backward passes per example",
                     exact_verdict(ok)))
    if timing is not None:
        long = [n for n in sorted(timing.repeats) if n >= 360]
        others = [m for m in TIMING_METHODS if m != "normxlogit"]
        for what, table, unit in (("faster", timing.seconds, "time"), ("more memory-efficient", timing.peak_mb, "peak memory")):
            if not long:
                rows.append((f"For inputs of 360 tokens or more NormXLogit is {what} than its counterparts (§4.2, Tables 4-5)",
                             "cost section", "no input of 360 tokens or more in this run",
                             untestable("no input of 360 tokens or more in this run")))
                continue
            ratios = {n: min(table[(m, n)] / max(table[("normxlogit", n)], 1e-9) for m in others) for n in long}
            rows.append((f"For inputs of 360 tokens or more NormXLogit is {what} than its counterparts (§4.2, Tables 4-5)",
                         f"`{timing.model_name}`, cost section",
                         "; ".join(f"{timing.tokens.get(n, n)} tokens: the closest other method takes {r:.1f}× its {unit}"
                                   for n, r in ratios.items()),
                         exact_verdict(all(r > 1 for r in ratios.values()))))
    return rows


def _ahead_of_baselines(al: Alignment) -> tuple[str, Verdict]:
    """The "ahead across almost all layers" claim: its verdict from the alignment without the anchor
    position (:attr:`Alignment.without_anchor`), NormXLogit against each baseline paired per layer;
    the reading with the anchor counted beside it."""
    free = al.without_anchor
    if free is None or free.versus is None or al.versus is None:
        return "–", untestable("this alignment has no reading without the anchor position (computed before it existed)")
    parts = []
    for reading, what in ((free, "without the anchor position"), (al, "with the anchor counted")):
        ahead, apart = layers_ahead(reading)
        parts.append(f"{what} ({reading.n} pairs): ahead of all three at {ahead} of {reading.layers} layers, paired "
                     f"intervals apart from all three at {apart}")
    ahead, apart = layers_ahead(free)
    return "; ".join(parts), count_verdict(apart, ahead, free.layers)


def _claims_exp2(al: Alignment | None) -> list[tuple[str, str, str, str]]:
    if al is None:
        return []
    idx = {m: EXP2_METHODS.index(m) for m in EXP2_METHODS}
    where = f"`{al.model_name}`, agreement pairs, AP"
    ap, low, high = al.ap, al.ap_low, al.ap_high
    rows = [("NormXLogit outperforms GlobEnc¬, ALTI¬ and Value Zeroing¬ across almost all layers (§5.2, Figure 4; "
             "tested without the anchor position, paired per layer: ≥ 80 % of layers)", where, *_ahead_of_baselines(al))]
    t, f = idx["logat_target"], idx["logat_foil"]
    above = int((ap[t] > ap[f]).sum())
    above_sep = int((low[t] > high[f]).sum()) if low is not None and high is not None else 0
    rows.append(("LogAt(foil) aligns lower than LogAt(target) (§5.2; tested at ≥ 80 % of layers)", where,
                 f"LogAt(target) above at {above} of {al.layers} layers ({above_sep} with separated intervals)",
                 count_verdict(above_sep, above, al.layers)))
    third = max(1, al.layers // 3)
    rise = float(np.mean(ap[t, -third:]) - np.mean(ap[t, :third]))
    fall = float(np.mean(ap[f, -third:]) - np.mean(ap[f, :third]))
    first, last = 0, al.layers - 1
    paired = ""
    if al.ap_change is not None:  # the same pairs at both layers: the paired difference
        change = {row: tuple(float(v) for v in al.ap_change[row]) for row in (t, f)}
        depth = all_of([difference_verdict(change[t], True), difference_verdict(change[f], False)])
        paired = (f"; layer {last + 1} − layer {first + 1}, paired over the pairs: LogAt(target) "
                  f"{interval_text(*change[t], sign=True)}, LogAt(foil) {interval_text(*change[f], sign=True)}")
    elif low is not None and high is not None:
        def at(row: int, layer: int) -> tuple[float, float, float]:
            return float(ap[row, layer]), float(low[row, layer]), float(high[row, layer])

        depth = all_of([interval_verdict(at(t, last), at(t, first)), interval_verdict(at(f, first), at(f, last))])
    else:
        depth = untestable("no per-layer intervals")
    rows.append(("With depth the target's alignment rises and the foil's drops (§5.2)", where,
                 f"last third minus first third of layers: LogAt(target) {rise:+.3f}, LogAt(foil) {fall:+.3f}; "
                 f"layer {last + 1} vs layer {first + 1} (intervals): LogAt(target) {alignment_cell(al, 'ap', t, last)} vs "
                 f"{alignment_cell(al, 'ap', t, first)}, LogAt(foil) {alignment_cell(al, 'ap', f, last)} vs "
                 f"{alignment_cell(al, 'ap', f, first)}{paired}",
                 depth))
    p = idx["logat_plural"]
    if np.isfinite(ap[p]).any():
        rest = [idx[m] for m in EXP2_METHODS if m not in ("logat_plural", "random")]
        pl = int(np.nanargmax(ap[p]))
        flat = ap[rest]
        br, bl = (int(v) for v in np.unravel_index(np.nanargmax(flat), flat.shape))
        other = rest[br]
        if low is not None and high is not None:
            plural = interval_verdict((ap[p, pl], low[p, pl], high[p, pl]), (flat[br, bl], low[other, bl], high[other, bl]))
        else:
            plural = untestable("no per-layer intervals")
        rows.append(('LogAt of the word "plural" outperforms all other methods by a notable margin (§5.2, A.3)', where,
                     f"best LogAt(plural) {alignment_cell(al, 'ap', p, pl)} at layer {pl + 1} vs best other "
                     f"{EXP2_NAMES[EXP2_METHODS[other]]} {alignment_cell(al, 'ap', other, bl)} at layer {bl + 1}",
                     plural))
    return rows


UNTESTABLE = (
    ("MNLI: NormXLogit ahead of the gradient methods on Llama 2 and BERT, integrated gradients slightly ahead on DeBERTa "
     "(§4.2, Table 1)", "no NLI data or classifier ships here"),
    ("QNLI: NormXLogit consistently ahead of the architecture-agnostic methods (§4.2, Table 1)",
     "no QA data or classifier ships here"),
    ("DeBERTa-v3 columns of Table 1", "no DeBERTa checkpoint ships here"),
    ("Alignment on RoBERTa fine-tuned on the BLiMP pairs (A.3)", "no masked LM ships here; BLiMP itself is not available"),
)


def claims_section(results: dict[str, Any], al: Alignment | None, timing: Timing | None) -> list[str]:
    """Markdown: every claim of the paper with this run's number and a verdict."""
    rows = _claims_exp1(results) + _claims_cost(results, timing) + _claims_exp2(al)
    rows += [(claim, "–", why, untestable(why)) for claim, why in UNTESTABLE]
    lines = [
        "## The paper's claims against this run",
        "",
        LEGEND + " Claims over layers or ratios: counted as stated in the row. Every number below is computed in this "
        "run (Experiment 1: on our analogue models and data, so a verdict speaks for them, not for the paper's models).",
        "",
        "| claim (paper) | where tested | our number | verdict |",
        "|---|---|---|---|",
    ]
    lines += [f"| {claim} | {where} | {number} | **{verdict.word}**{f' ({verdict.reason})' if verdict.reason else ''} |"
              for claim, where, number, verdict in rows]
    return lines + [""]
