"""NormXLogit report, markdown: the sections of ``normxlogit.md`` (each case's tables, the
alignment and logit-lens sections, the cost tables, the coverage of the paper's experiments)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from heedful.evaluate.report import fmt
from heedful.reproduce.normxlogit.run import (
    BERT,
    COST_NAMES,
    EXP2_METHODS,
    EXP2_NAMES,
    GRADIENT_ROWS,
    METHODS,
    NAMES,
    PAPER_STSB_PEARSON,
    PAPER_TIMING,
    PLURAL,
    RANDOM_SEEDS_EXP2,
    TIMING_METHODS,
    VARIANTS,
    Alignment,
    Case,
    Timing,
    _aggregation_note,
)
from heedful.reproduce.normxlogit.statistics import (
    better,
    layers_ahead,
    leader,
    ordering,
    pair_agreement,
    verdict,
)
from heedful.reproduce.toolkit import (
    coverage_section,
    interval_text,
    summary_text,
)


def _names(order: list[str]) -> str:
    return " > ".join(NAMES.get(m, m) for m in order)


def rows_of(result: Any) -> list[str]:
    """The rows of an Experiment 1 table present in ``result``: the paper's methods, then the variants."""
    return [k for k in (*METHODS, *(v.key for v in VARIANTS)) if k in result.groups]


def ordering_chain(order: list[str], intervals: dict[str, tuple[float, float]]) -> str:
    """``A > B ≈ C``: ``≈`` where the 95 % intervals of adjacent methods overlap
    (:func:`heedful.evaluate.report.overlapping`), ``>`` where they are separated, ``>?`` where
    one of the two has no interval."""
    from heedful.evaluate.report import overlapping

    parts = [NAMES.get(order[0], order[0])] if order else []
    for a, b in zip(order, order[1:], strict=False):
        pair = {a: intervals[a], b: intervals[b]}
        known = all(math.isfinite(v) for iv in pair.values() for v in iv)
        sign = ("≈" if overlapping(pair) else ">") if known else ">?"
        parts.append(f"{sign} {NAMES.get(b, b)}")
    return " ".join(parts)


def adjacent_overlaps(order: list[str], intervals: dict[str, tuple[float, float]]) -> list[str]:
    """``"A / B"`` for each pair adjacent in ``order`` whose 95 % intervals overlap."""
    from heedful.evaluate.report import overlapping

    found = []
    for a, b in zip(order, order[1:], strict=False):
        found += [f"{NAMES.get(a, a)} / {NAMES.get(b, b)}" for _ in overlapping({a: intervals[a], b: intervals[b]})]
    return found


def _eq8_lines(result: Any, metric: str, higher: bool) -> list[str]:
    """The regression case: Eq. 8 nearest first (heedful) against the printed sign, and random."""
    groups = result.groups
    if not all(k in groups for k in ("logat", "normxlogit", "logat_far", "normxlogit_far", "random")):
        return []
    s = {k: groups[k].summaries[metric] for k in ("logat", "normxlogit", "logat_far", "normxlogit_far", "random")}
    rnd = s["random"]
    lines = [f"**Eq. 8's ranking direction** ({metric}, {'higher' if higher else 'lower'} is better; random "
             f"{summary_text(rnd)}):", ""]
    for near, far in (("logat", "logat_far"), ("normxlogit", "normxlogit_far")):
        ahead_near, sep_near = better(s[near], rnd, higher)
        ahead_far, sep_far = better(s[far], rnd, higher)
        lines.append(
            f"- {NAMES[near]}: nearest first {summary_text(s[near])} "
            f"({'ahead of' if ahead_near else 'behind'} random{', separated' if sep_near else ', intervals overlap'}); "
            f"farthest first (the printed sign) {summary_text(s[far])} "
            f"({'ahead of' if ahead_far else 'behind'} random{', separated' if sep_far else ', intervals overlap'}); "
            f"nearest first is {'ahead of' if better(s[near], s[far], higher)[0] else 'behind'} the printed sign"
            f"{' (separated)' if better(s[near], s[far], higher)[1] else ' (intervals overlap)'}."
        )
    lines += [
        "",
        "The paper prints Eq. 8 as the distance |HoT(x_i) − HoT(x_CLS)| and calls the tokens with the highest "
        "scores the most important, while its text motivates LogAt by the opposite: \"the [CLS] token has a higher "
        "degree of similarity to the most important input tokens ... To identify the tokens that are most similar "
        "to [CLS], we use the head-on-top\" (v2 §3.3; its abstract: importance is \"how predictive its "
        "representation is of the model's final output\"). The released code has no regression case (it ships "
        "MultiNLI and BLiMP notebooks only). Its STS-B results put LogAt and NormXLogit far ahead of random "
        f"(BERT: {fmt(PAPER_STSB_PEARSON['logat'][BERT])} and {fmt(PAPER_STSB_PEARSON['normxlogit'][BERT])} vs "
        f"{fmt(PAPER_STSB_PEARSON['random'][BERT])}), which is what the nearest-first reading gives here and the "
        "printed sign does not; heedful ranks nearest first by default (`regression_rank=\"near\"`; "
        "`\"far\"` is the printed sign).",
        "",
    ]
    return lines


def _gradient_sign_lines(result: Any, metric: str, higher: bool) -> list[str]:
    """L1-aggregated gradient rows (the paper's) against the signed sums."""
    lines = []
    for l1, signed in (("grad_x_input", "grad_x_input_signed"), ("integrated_gradients", "integrated_gradients_signed")):
        if l1 not in result.groups or signed not in result.groups:
            continue
        a, b = result.groups[l1].summaries[metric], result.groups[signed].summaries[metric]
        ahead, separated = better(b, a, higher)
        lines.append(
            f"- {NAMES[l1]}: L1 {summary_text(a)}, signed sum {summary_text(b)} -- the signed sum is "
            f"{'ahead' if ahead else 'behind'}{' (separated)' if separated else ' (intervals overlap)'}."
        )
    return ([f"**Gradient aggregation** ({metric}):", "", *lines, ""]) if lines else []


def case_section(case: Case, result: Any, wall: float, plots: list[Path], ig_steps: int, aggregate: str | None) -> list[str]:
    """Markdown of one case: ours vs the paper, ordering agreement, per-ratio curves, cost."""
    from heedful.evaluate.metrics import METRICS

    p = result.spec.protocol
    rows = rows_of(result)
    removal = "deletion" if case.decoder else "`[MASK]`"
    skipped = ", ".join(f"{k}: {v}" for k, v in result.skipped.items())
    lines = [
        f"- data: `movies` test split (VADER movie-review snippets), first {result.n_examples} examples"
        + (f" (skipped: {skipped})" if skipped else ""),
        f"- model: `{result.model_name}`; removal: {removal}; output watched: "
        + ("the regression value" if result.task == "regression" else f"probability of the {p.label} class")
        + "; "
        f"means over {int(100 * p.mean_over[0])}..{int(100 * p.mean_over[1])} % of tokens removed",
        f"- integrated gradients: {ig_steps} steps (Gauss-Legendre); {_aggregation_note(aggregate)}; the "
        "\"signed sum\" rows run gradient × input and integrated gradients with `aggregate=\"sum\"` (the gradient "
        "norm has no signed form)",
        f"- random: mean ± std over {p.random_seeds} seeds; wall time of this section in this run: {wall / 60:.1f} min "
        "(stored explanations and measurements reused; the s / example column is the cost of explaining)",
    ]
    if result.task == "regression":
        lines.append("- LogAt and NormXLogit: Eq. 8 nearest first (heedful's default); the \"as printed\" rows rank "
                     "the farthest first (see *Eq. 8's ranking direction* below)")
    if result.n_examples < 100:
        lines.append(f"- **small sample** (n = {result.n_examples}, chosen to fit the time budget): the ordering of "
                     "methods whose values are close is not reliable")
    lines += [""]
    header = ["method"]
    for metric in case.metrics:
        arrow = "↑" if METRICS[metric].higher_is_better else "↓"
        header.append(f"{metric} {arrow} (ours)")
        if metric in case.paper:
            header.append(f"paper ({case.column_name})")
    header.append("s / example")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in rows:
        res = result.groups[method]
        cells = [NAMES[method]]
        for metric in case.metrics:
            cells.append(summary_text(res.summaries[metric], res.seeds))
            if metric in case.paper:
                cells.append(fmt(case.paper[metric].get(method, (None, None))[case.column]))
        cells.append(fmt(res.cost["seconds"], digits=4))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Brackets: 95 % percentile bootstrap interval over examples (1000 resamples; for the Pearson "
              "metrics r is recomputed on every resample; the random baseline: of the per-example means over its "
              "seeds, for the Pearson metrics: of the mean over its seeds of r on each resample); ± is the standard deviation over the random seeds.", ""]
    for metric, label in (("accuracy", "Accuracy"), ("pearson", "Pearson r")):
        clean = result.groups["normxlogit"].summaries[metric].curve if metric in case.metrics else None
        if clean is not None and len(clean) and result.x[0] == 0 and math.isfinite(clean[0]):
            lines += [f"{label} of the unperturbed model on these examples (ratio 0): {clean[0]:.3f}.", ""]
    for metric in case.metrics:
        higher = METRICS[metric].higher_is_better
        summaries = {m: result.groups[m].summaries[metric] for m in rows}
        ours = {m: s.value for m, s in summaries.items()}
        intervals = {m: (s.low, s.high) for m, s in summaries.items()}
        ours_order = ordering(ours, higher)
        close = adjacent_overlaps(ours_order, intervals)
        lines += [
            f"**Ordering by {metric}** ({'higher' if higher else 'lower'} is better; `≈`: the 95 % intervals of the "
            "two adjacent methods overlap, `>`: separated):",
            "",
            f"- ours: {ordering_chain(ours_order, intervals)}",
            "- adjacent methods whose intervals overlap (no difference claimed): " + ("; ".join(close) if close else "none") + ".",
        ]
        if metric in case.paper:
            paper = {m: v[case.column] for m, v in case.paper[metric].items()}
            share, pairs, tau = pair_agreement({m: ours[m] for m in METHODS if m in ours}, paper)
            paper_order = ordering(paper, higher)
            lines += [
                f"- paper ({case.column_name}): {_names(paper_order)}",
                f"- {share * 100:.0f} % of the {pairs} pairs of the paper's methods are ordered alike (Kendall τ = "
                f"{fmt(tau, digits=2)}): the ordering **{verdict(share)}** with the paper's"
                + (f"; best method: ours {NAMES[ours_order[0]]}, paper {NAMES[paper_order[0]]}" if ours_order else "")
                + ".",
            ]
        lines.append("")
        if result.task == "regression" and metric == "pearson":
            lines += _eq8_lines(result, metric, higher)
        if metric == case.metrics[0]:
            lines += _gradient_sign_lines(result, metric, higher)
        nx, rnd = summaries["normxlogit"], summaries["random"]
        if "embedding_norm" in summaries and not better(summaries["embedding_norm"], rnd, higher)[0]:
            lines += [f"- The embedding norm is behind random on {metric} here; it does not depend on the task "
                      "or the predicted class at all.", ""]
        gradient_rows = [m for m in (*GRADIENT_ROWS, "random") if m in summaries]
        beaten = [m for m in gradient_rows if better(summaries[m], nx, higher)[0]]
        unseparated = [m for m in gradient_rows if m not in beaten and not better(nx, summaries[m], higher)[1]]
        lines += [
            "- NormXLogit vs the gradient rows and random: "
            + ("ahead of all of them" if not beaten else f"behind {', '.join(NAMES[m] for m in beaten)}")
            + (f"; not separated from {', '.join(NAMES[m] for m in unseparated)}" if unseparated else "")
            + ".",
            "",
        ]
        if "decompx" in summaries and math.isfinite(summaries["decompx"].value) and metric in case.paper:
            dx = summaries["decompx"]
            said = case.paper[metric]["decompx"][case.column]
            paper_nx = case.paper[metric]["normxlogit"][case.column]
            sep = better(dx, nx, higher)[1]
            lines += [
                f"- DecompX vs NormXLogit: {summary_text(dx)} vs {summary_text(nx)}, {leader(dx.value, nx.value, higher)} "
                f"ahead{' (separated)' if sep else ' (intervals overlap)'}; "
                + (f"the paper ({case.column_name}): {fmt(said)} vs {fmt(paper_nx)}, {leader(said, paper_nx, higher)} ahead."
                   if said is not None else f"the paper has no DecompX number for {case.column_name} (\"N/A\": it "
                   "calls DecompX specific to BERT-like encoders; heedful's decomposes the Llama family as well)."),
                "",
            ]
    curve_metrics = [m for m in case.metrics if METRICS[m].curve_kind == "ratio"]
    for metric in curve_metrics:
        xs = [f"{100 * x:.0f}%" for x in result.x]
        lines += [f"<details><summary>{metric} per perturbation ratio</summary>", "",
                  "| method | " + " | ".join(xs) + " |", "|" + "---|" * (len(xs) + 1)]
        for method in rows:
            curve = result.groups[method].summaries[metric].curve
            if curve is None:
                continue
            lines.append(f"| {NAMES[method]} | " + " | ".join(fmt(v) for v in curve) + " |")
        lines += ["", "</details>", ""]
    for path in plots:
        lines += [f"![{path.stem}]({path.name})", ""]
    return lines


def _trend(row: np.ndarray, third: int) -> str:
    return f"{np.nanmean(row[:third]):.3f} → {np.nanmean(row[-third:]):.3f}"


def alignment_cell(al: Alignment, key: str, row: int, layer: int) -> str:
    """``value [low, high]`` of method ``row`` at ``layer`` for metric ``key`` (``"dot"`` / ``"ap"``);
    the random row also ``± std over seeds``."""
    values, std = getattr(al, key), getattr(al, f"{key}_std")
    low, high = getattr(al, f"{key}_low"), getattr(al, f"{key}_high")
    bounds = (low[row, layer], high[row, layer]) if low is not None and high is not None else (math.nan, math.nan)
    return interval_text(values[row, layer], *bounds, std=std[row, layer] if EXP2_METHODS[row] == "random" else None)


def alignment_section(al: Alignment, plot: Path) -> list[str]:
    from heedful.datasets.agreement import BLIMP_UIDS

    lines = [
        f"- model: `{al.model_name}` (causal LM; the input is the sentence up to the target word, the "
        "explained output is the next-token logit of the target (LogAt(target), NormXLogit) or of the foil "
        "(LogAt(foil)); the head is applied to every layer's hidden states after the final norm, the "
        "logit lens)",
        f"- data: {al.n} generated agreement minimal pairs (heedful's generator following BLiMP's paradigms, "
        "**not BLiMP**; evidence known by construction), the paradigms whose evidence precedes the target"
        + (f"; skipped: {', '.join(f'{k}: {v}' for k, v in al.skipped.items())}" if al.skipped else ""),
        "- metrics: dot product of the softmax-normalised scores with the evidence vector, average precision "
        "of the ranking (NormXLogit protocol; every position of the prefix counts)",
        "- GlobEnc¬, ALTI¬ and Value Zeroing¬: each layer's own token-to-token matrix, the anchor's row, without "
        "rollout (as the paper's Experiment 2; `rollout=False, layerwise=True`); in this pre-LN decoder GlobEnc's "
        "norm is that of each source's vector after attention (no norm follows the block). LogAt(plural): the "
        f"logit lens of the word \"{PLURAL}\" (the paper's appendix A.3 analysis)",
        f"- embedding norm and random are the same at every layer; random: uniform scores, mean over "
        f"{RANDOM_SEEDS_EXP2} seeds (the paper's random baseline gives all tokens equal scores)",
        "- the paper runs this on a masked LM (RoBERTa) over five BLiMP paradigms, where the evidence may follow "
        "the masked word and the paper reports NormXLogit best at almost all layers, LogAt(foil) below "
        "LogAt(target), the foil falling and the target rising with depth; here a causal LM sees only the prefix, "
        "so the comparison is in kind, not in number",
        f"- one forward pass per batch of pairs serves every method and layer; computed in {al.seconds:.0f} s",
        "",
        f"![layer x method alignment]({plot.name})",
        "",
    ]
    for key, values, title in (("dot", al.dot, "Dot product"), ("ap", al.ap, "Average precision")):
        best_r, best_l = np.unravel_index(np.nanargmax(values), values.shape)
        lines += [f"**{title}** (↑): best cell {EXP2_NAMES[EXP2_METHODS[best_r]]} at layer {best_l + 1} "
                  f"({alignment_cell(al, key, int(best_r), int(best_l))}); brackets: 95 % bootstrap intervals over pairs (random: of the "
                  "per-pair means over its seeds; ± its std over seeds).", ""]
        lines += ["| method | best layer | value there | last layer | mean over layers |", "|---|---|---|---|---|"]
        for r, m in enumerate(EXP2_METHODS):
            row = values[r]
            b = int(np.nanargmax(row))
            lines.append(
                f"| {EXP2_NAMES[m]} | {b + 1 if m not in ('embedding_norm', 'random') else '–'} | "
                f"{alignment_cell(al, key, r, b)} | {alignment_cell(al, key, r, len(row) - 1)} | {fmt(float(np.nanmean(row)))} |"
            )
        lines.append("")
        wins = {m: 0 for m in EXP2_METHODS}
        for layer in range(values.shape[1]):
            wins[EXP2_METHODS[int(np.nanargmax(values[:, layer]))]] += 1
        lines += ["Best method per layer (count of layers): "
                  + ", ".join(f"{EXP2_NAMES[m]} {c}" for m, c in wins.items() if c) + ".", ""]
        tgt, foil = values[EXP2_METHODS.index("logat_target")], values[EXP2_METHODS.index("logat_foil")]
        third = max(1, values.shape[1] // 3)
        lines += [f"LogAt(target) above LogAt(foil) at {int((tgt > foil).sum())} of {values.shape[1]} layers. "
                  f"Mean over the first → last third of layers: LogAt(target) {_trend(tgt, third)}, "
                  f"LogAt(foil) {_trend(foil, third)}, NormXLogit {_trend(values[EXP2_METHODS.index('normxlogit')], third)}.",
                  ""]
        ours = values[EXP2_METHODS.index("normxlogit")]
        theirs = values[[EXP2_METHODS.index(m) for m in ("globenc", "alti", "value_zeroing")]]
        if np.isfinite(theirs).any():
            lines += [f"NormXLogit above all of GlobEnc¬, ALTI¬ and Value Zeroing¬ at {int((ours > np.nanmax(theirs, axis=0)).sum())} "
                      f"of {values.shape[1]} layers (the paper: \"across almost all layers\").", ""]
    for values, title in ((al.dot, "Dot product"), (al.ap, "Average precision")):
        lines += [f"<details><summary>{title} per layer</summary>", "",
                  "| method | " + " | ".join(str(i + 1) for i in range(al.layers)) + " |", "|" + "---|" * (al.layers + 1)]
        lines += [f"| {EXP2_NAMES[m]} | " + " | ".join(fmt(v, digits=2) for v in values[r]) + " |" for r, m in enumerate(EXP2_METHODS)]
        lines += ["", "</details>", ""]
    nx = EXP2_METHODS.index("normxlogit")
    best_layer = int(np.nanargmax(al.ap[nx]))
    lines += [f"<details><summary>Per paradigm at NormXLogit's best AP layer ({best_layer + 1})</summary>", "",
              "| paradigm (BLiMP counterpart) | n | " + " | ".join(f"{EXP2_NAMES[m]} AP" for m in EXP2_METHODS) + " |",
              "|" + "---|" * (len(EXP2_METHODS) + 2)]
    for paradigm, vals in al.paradigms.items():
        lines.append(f"| {paradigm} ({BLIMP_UIDS[paradigm]}) | {int(vals['n'])} | "
                     + " | ".join(fmt(vals["ap"][r, best_layer]) for r in range(len(EXP2_METHODS))) + " |")
    lines += ["", "</details>", ""]
    return lines


def _mean(al: Alignment, key: str, row: int) -> str:
    values = getattr(al, key)[row]
    return fmt(float(np.nanmean(values))) if np.isfinite(values).any() else "–"


def _paradigm_cells(vals: dict[str, np.ndarray], key: str, layer: int) -> list[str]:
    low, high = vals.get(f"{key}_low"), vals.get(f"{key}_high")
    return [interval_text(vals[key][r, layer], *((low[r, layer], high[r, layer]) if low is not None else (math.nan,) * 2),
                          digits=2) for r in range(len(EXP2_METHODS))]


def anchor_section(al: Alignment) -> list[str]:
    """Markdown: the alignment with the anchor position taken out of scores and evidence, beside the
    reading with it (overall, NormXLogit against the per-layer baselines paired per layer, and per
    paradigm with intervals)."""
    from heedful.datasets.agreement import BLIMP_UIDS

    free = al.without_anchor
    if free is None:
        return []
    lines = [
        "### Without the anchor position",
        "",
        "In `sv_agreement` and `noun_after_determiner` the evidence word is the last prefix token: the anchor, whose "
        "state makes the prediction. A method that puts a layer's weight on the anchor itself (GlobEnc¬ and ALTI¬ read "
        "the anchor's row of each layer's token-to-token matrix, where its own entry is large) is then aligned with the "
        "evidence without finding anything beyond the position that predicts. Here the anchor position is taken out of "
        "both the scores and the evidence of every pair (the dot product's softmax runs over the remaining positions); "
        "a pair whose evidence was the anchor alone drops out, so the paradigms where the evidence is the anchor keep "
        f"only the pairs whose evidence word spans more tokens. Pairs: {al.n} with the anchor, {free.n} without.",
        "",
        "| method | AP with the anchor: best layer | AP without: best layer | AP mean over layers, with → without | "
        "dot mean over layers, with → without |",
        "|---|---|---|---|---|",
    ]
    for r, m in enumerate(EXP2_METHODS):
        cells = []
        for reading in (al, free):
            row = reading.ap[r]
            if not np.isfinite(row).any():
                cells.append("–")
                continue
            b = int(np.nanargmax(row))
            where = "" if m in ("embedding_norm", "random") else f"layer {b + 1}: "
            cells.append(where + alignment_cell(reading, "ap", r, b))
        means = [f"{_mean(al, key, r)} → {_mean(free, key, r)}" for key in ("ap", "dot")]
        lines.append(f"| {EXP2_NAMES[m]} | {cells[0]} | {cells[1]} | {means[0]} | {means[1]} |")
    lines += ["", "NormXLogit against each of GlobEnc¬, ALTI¬ and Value Zeroing¬ at every layer, paired over the "
              "pairs (95 % paired bootstrap interval of the difference; the claims table's verdict reads the "
              "reading without the anchor):", "",
              "| reading | metric | layers ahead of all three (estimate) | layers apart from all three (paired intervals) |",
              "|---|---|---|---|"]
    for reading, what in ((free, "without the anchor"), (al, "with the anchor")):
        if reading.versus is None:
            continue
        for key, title in (("ap", "average precision"), ("dot", "dot product")):
            ahead, apart = layers_ahead(reading, key)
            lines.append(f"| {what} ({reading.n} pairs) | {title} | {ahead} of {reading.layers} | {apart} of {reading.layers} |")
    nx = EXP2_METHODS.index("normxlogit")
    layer = int(np.nanargmax(al.ap[nx]))
    header = "| paradigm (BLiMP counterpart) | anchor | n | " + " | ".join(EXP2_NAMES[m] for m in EXP2_METHODS) + " |"
    rule = "|" + "---|" * (len(EXP2_METHODS) + 3)
    for key, title, fold in (("ap", "Average precision", False), ("dot", "Dot product", True)):
        what = (f"{title} per paradigm at layer {layer + 1} (NormXLogit's best AP layer with the anchor), with and "
                "without the anchor position; brackets: 95 % bootstrap intervals over the paradigm's pairs")
        lines += ["", f"<details><summary>{what}</summary>" if fold else f"**{what}.**", "", header, rule]
        for paradigm in al.paradigms:
            for reading, what in ((al, "with"), (free, "without")):
                vals = reading.paradigms.get(paradigm)
                if vals is None:
                    continue
                cells = _paradigm_cells(vals, key, layer) if int(vals["n"]) else ["–"] * len(EXP2_METHODS)
                lines.append(f"| {paradigm} ({BLIMP_UIDS[paradigm]}) | {what} | {int(vals['n'])} | " + " | ".join(cells) + " |")
        lines += ["", *(["</details>", ""] if fold else [])]
    for values, title in ((free.dot, "Dot product"), (free.ap, "Average precision")):
        lines += [f"<details><summary>{title} per layer, without the anchor position</summary>", "",
                  "| method | " + " | ".join(str(i + 1) for i in range(free.layers)) + " |", "|" + "---|" * (free.layers + 1)]
        lines += [f"| {EXP2_NAMES[m]} | " + " | ".join(fmt(v, digits=2) for v in values[r]) + " |" for r, m in enumerate(EXP2_METHODS)]
        lines += ["", "</details>", ""]
    return lines


def _layer_span(layers: list[int]) -> str:
    """``"12-19, 21"`` from 0-based layer indices (shown 1-based)."""
    spans: list[list[int]] = []
    for layer in layers:
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ", ".join(f"{a + 1}" if a == b else f"{a + 1}-{b + 1}" for a, b in spans)


def below_random(al: Alignment, method: str = "logat_target") -> list[int]:
    """Layers (0-based) where ``method``'s dot-product interval lies wholly below random's."""
    m, r = EXP2_METHODS.index(method), EXP2_METHODS.index("random")
    if al.dot_low is None or al.dot_high is None:
        return [k for k in range(al.layers) if al.dot[m, k] < al.dot[r, k]]
    return [k for k in range(al.layers) if al.dot_high[m, k] < al.dot_low[r, k]]


def lens_section(al: Alignment, plot: Path) -> list[str]:
    """Markdown: the logit lens's quality per layer and what it says about the layers where
    LogAt(target) aligns below random."""
    lens = al.lens
    if lens is None:
        return []
    t, r = EXP2_METHODS.index("logat_target"), EXP2_METHODS.index("random")
    below = below_random(al)
    late = list(range(max(0, al.layers - 3), al.layers))
    lines = [
        "### Why some layers align below random: the logit lens of each layer",
        "",
        "For every pair and layer, the final norm and unembedding applied to that layer's state at the anchor "
        "(the last prefix token; what LogAt reads at every position): whether it gives the target a higher logit "
        "than the foil, the KL divergence of the final layer's next-token distribution from it, and the target's "
        "rank in the vocabulary (geometric mean of 1 + rank, minus 1); beside them, the share of pairs whose "
        "LogAt(target) puts its top score on the first token, and the median ratio of the first token's hidden-state "
        "norm to the median norm of the other positions. Brackets: 95 % bootstrap intervals over pairs.",
        "",
        f"![logit lens per layer]({plot.name})",
        "",
        "| layer | lens prefers target | KL(final ‖ layer) | target rank | LogAt(target) top at first token | "
        "first-token norm ÷ others | LogAt(target) dot | random dot |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(key: str, k: int, pct: bool = False) -> str:
        v, lo, hi = lens[key][k], lens[f"{key}_low"][k], lens[f"{key}_high"][k]
        f = (lambda z: f"{100 * z:.0f} %") if pct else (lambda z: f"{z:.2f}")
        return f"{f(v)} [{f(lo)}, {f(hi)}]"

    def dot_cell(row: int, k: int) -> str:
        if al.dot_low is None or al.dot_high is None:
            return fmt(al.dot[row, k])
        return f"{fmt(al.dot[row, k])} [{fmt(al.dot_low[row, k])}, {fmt(al.dot_high[row, k])}]"

    for k in range(al.layers):
        rank = 10 ** lens["log_rank"][k] - 1
        lines.append(
            f"| {k + 1} | {cell('correct', k, True)} | {cell('kl', k)} | {rank:.0f} | {cell('top_first', k, True)} | "
            f"{lens['first_norm'][k]:.0f}× | {dot_cell(t, k)} | {dot_cell(r, k)} |"
        )
    lines.append("")
    if not below:
        return lines + ["LogAt(target)'s dot product is not below random's at any layer here (intervals).", ""]

    def mean(key: str, layers: list[int]) -> float:
        return float(np.mean(lens[key][layers]))

    correct, kl, top = mean("correct", below), mean("kl", below), mean("top_first", below)
    rank = 10 ** mean("log_rank", below) - 1
    norm = float(np.median(lens["first_norm"][below]))
    first = float(lens["evidence_first"])
    chance = all(lens["correct_low"][k] <= 0.5 <= lens["correct_high"][k] for k in below)
    lines += [
        f"**What the numbers say.** LogAt(target)'s dot product lies below random's (intervals separated) at layers "
        f"{_layer_span(below)}. There the logit lens prefers the target over the foil in {100 * correct:.0f} % of pairs "
        + ("(every one of these layers' intervals contains 50 %: chance)" if chance else "(chance: 50 %)")
        + f", its distribution is {kl:.1f} nats from the final one and the target's typical rank is {rank:.0f}; in "
        f"the last three layers ({_layer_span(late)}) the same numbers are {100 * mean('correct', late):.0f} %, "
        f"{mean('kl', late):.1f} nats and {10 ** mean('log_rank', late) - 1:.0f}. "
        + ("Read through the final norm and unembedding, these layers' states do not yet carry the agreement "
           "decision, so LogAt at them measures something other than evidence for the target. " if chance else
           "Read through the final norm and unembedding, these layers' states carry little of the agreement decision "
           f"(within {100 * (correct - 0.5):.0f} points of chance, against {100 * (mean('correct', late) - 0.5):.0f} "
           "at the end), so LogAt at them mostly measures something other than evidence for the target. "
           if correct < 0.65 and kl > 5 else "")
        + f"In those layers LogAt(target)'s top score sits on the first token in {100 * top:.0f} % of pairs, while "
        f"the first token is evidence in {100 * first:.0f} % of pairs; the first token's state there has {norm:.0f}× "
        "the median norm of the other positions"
        + (" (a massive activation of the first position, which the final norm rescales into an extreme logit "
           "vector)" if norm >= 10 else "")
        + ". "
        + ("The dot product normalises scores with a softmax over the prefix, so scores that concentrate on a "
           "non-evidence first token give the evidence less mass than uniform random scores do -- below random "
           "rather than at it." if top > first + 0.1 else
           "The first token is not where LogAt concentrates more often than it is evidence, so it does not explain "
           "the gap by itself."),
        "",
    ]
    return lines


def timing_section(timing: Timing) -> list[str]:
    """Markdown of the cost comparison: ours beside the paper's Table 4, and peak memory."""
    import torch

    lengths = sorted(timing.repeats)
    names = [COST_NAMES[m] for m in TIMING_METHODS]
    lines = [
        f"- model: `{timing.model_name}` (MiniLM-L6, 6 layers, hidden size 384; the paper: BERT-base, 12 layers, 768, on "
        "an RTX 8000 GPU); one input of each length (movie snippets joined and cut), explained alone (batch of one) "
        f"with heedful's defaults; integrated gradients with {timing.ig_steps} steps (the paper: 50); "
        f"CPU, {torch.get_num_threads()} torch thread(s)",
        "- seconds: median over " + ", ".join(f"{timing.repeats[n]} run(s) at {n}" for n in lengths)
        + " after one warm-up run of every method; peak memory: the increase of the process's peak resident memory "
        "during the run over its resident memory before it (the model's weights excluded)",
        "",
        "**Seconds per example** (ours; the paper's Table 4 in brackets where it has the method):",
        "",
        "| input length | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for n in lengths:
        cells = []
        for m in TIMING_METHODS:
            said = PAPER_TIMING.get(n, {}).get(m)
            cells.append(f"{timing.seconds[(m, n)]:.3f}" + (f" ({said:.2f})" if said is not None else ""))
        lines.append(f"| {timing.tokens.get(n, n)} | " + " | ".join(cells) + " |")
    lines += ["", "**Peak memory per example (MB)**:", "", "| input length | " + " | ".join(names) + " |",
              "|" + "---|" * (len(names) + 1)]
    for n in lengths:
        lines.append(f"| {timing.tokens.get(n, n)} | " + " | ".join(f"{timing.peak_mb[(m, n)]:.0f}" for m in TIMING_METHODS) + " |")
    longest = lengths[-1]
    nx_s, nx_mb = timing.seconds[("normxlogit", longest)], timing.peak_mb[("normxlogit", longest)]
    slower = {m: timing.seconds[(m, longest)] / nx_s for m in TIMING_METHODS if m != "normxlogit"}
    lines += [
        "",
        f"At {timing.tokens.get(longest, longest)} tokens NormXLogit takes {nx_s:.3f} s and {nx_mb:.0f} MB; the others take "
        + ", ".join(f"{COST_NAMES[m]} {r:.1f}×" for m, r in slower.items())
        + " its time. The paper's Table 5 (largest batch within 48 GB of GPU memory, time per instance at that batch) "
        "is not reproduced as such: heedful sizes its batches by its memory estimator; the time per example of every "
        "method at the experiment's batching is the `s / example` column of each Experiment 1 table.",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------- the paper's experiments
PAPER_EXPERIMENTS: tuple[tuple[str, str, str], ...] = (
    ("Exp. 1, SST-2, BERT-base (Table 1-3: AOPC, accuracy; Figures)", "analogue",
     "MiniLM-L6 fine-tuned on the movie snippets (Rotten Tomatoes sentences, SST's source), `[MASK]` removal; every "
     "method of the table, DecompX included"),
    ("Exp. 1, SST-2, Llama 2 with LoRA", "analogue",
     "the SmolLM2-135M classifier (`smollm2-sentiment`), deletion; DecompX added where the paper has N/A"),
    ("Exp. 1, STS-B regression (Table 1, Pearson; Eq. 8)", "analogue",
     "MiniLM regression on snippet ratings; DecompX as the norm of the final decomposed vectors, as the paper; Eq. 8 "
     "nearest first and, as extra rows, as printed (farthest first)"),
    ("Exp. 1, DeBERTa-v3 columns", "not reproduced",
     "no DeBERTa checkpoint ships here (heedful's DeBERTa-v2 adapter is tested on tiny random models only)"),
    ("Exp. 1, MNLI and QNLI columns", "not reproduced",
     "no NLI or QA data or classifier ships in any package obtainable here (MODELS.md)"),
    ("Value Zeroing global scores on SST-2 (A.2, Figure 6)", "analogue",
     "its rolled-out scores as a row of each Experiment 1 table"),
    ("Exp. 2, BLiMP evidence alignment per layer on RoBERTa (Figures 4-5)", "analogue",
     "generated agreement pairs (not BLiMP) on the causal `smollm2-135m`: LogAt(target / foil), NormXLogit, "
     "GlobEnc¬, ALTI¬, Value Zeroing¬, embedding norm, random at every layer"),
    ("Exp. 2, LogAt of the word \"plural\" (A.3, Figures 25-26)", "analogue",
     "the LogAt(plural) row of Experiment 2"),
    ("Exp. 2 on fine-tuned RoBERTa (A.3, Figures 27-28)", "not reproduced",
     "no masked LM ships here; the causal LM is not fine-tuned on the pairs"),
    ("Runtime by input length (Table 4)", "analogue", "MiniLM on CPU at 40-512 tokens, peak memory beside it"),
    ("Batch size within GPU memory and time per instance (Table 5)", "analogue (time only)",
     "time per example at the experiment's batching in each Experiment 1 table; no GPU, batches sized by the "
     "memory estimator"),
)


def experiments_section() -> list[str]:
    """Markdown: every experiment of the paper and whether this report reproduces it."""
    return coverage_section(PAPER_EXPERIMENTS)
