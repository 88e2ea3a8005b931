"""Mask-LRP report, markdown: every section of ``mask-lrp.md`` and its claims table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from heedful.engine.machine import cpuinfo
from heedful.reproduce.mask_lrp.claims import _why_section
from heedful.reproduce.mask_lrp.plots import VARIANT_ROWS
from heedful.reproduce.mask_lrp.run import (
    ALL_HEADS,
    CORRUPTION_RATES,
    DATASET_NOTES,
    EXTRA_NOTES,
    PAIRED,
    PAPER_ROWS,
    PAPER_TABLE1,
    PAPER_TABLE2_GPT2,
    RANDOM_MASK,
    RANDOM_REFERENCE,
    REFERENCE,
    _corrupted_label,
    _DatasetRun,
    _Plan,
    _PlantedRun,
    _time_label,
    _timings,
)
from heedful.reproduce.mask_lrp.statistics import (
    _concordance,
    _corruption_points,
    _corruption_trend,
    _cost,
    _curve,
    _difference,
    _interval,
    _ours,
    _ranks,
    _standard_error,
    _values,
    _verdict,
)
from heedful.reproduce.toolkit import coverage_section, interval_text, spearman


def _planted_section(plan: _Plan, run: _PlantedRun) -> list[str]:
    """Markdown of the planted precision@20 run (see :func:`_planted_run`)."""
    from heedful.evaluate.intervals import bootstrap_mean
    from heedful.evaluate.report import overlapping

    result = run.result
    n, k = len(run.ids), result.spec.protocol.precision_k
    answered = int(run.answered.sum())
    times = _timings(plan, [run])
    computed = times.get(_time_label(run, plan.split), run.seconds)
    planted, question, target, distractors = run.example
    lines = [
        "## Token precision@20 on planted long contexts",
        "",
        f"The paper measures how well an explanation finds a QA answer with precision@20 on SQuAD (Table 2): of the "
        f"{k} highest-scored tokens, the share inside the gold answer. No QA data ships here, so the metric is computed "
        f"on planted long contexts, where the answer sentence is known by construction: `{result.model_name.rsplit('@', 1)[0]}` "
        f"reads {n} documents of at most {plan.planted_length} tokens (`heedful.datasets.load(\"planted\", \"test\", "
        f"n={n}, length={plan.planted_length}, tokenizer=model.tokenizer)`, {run.prompt_tokens:.0f} tokens on average): "
        "movie-review snippets of the test split, one per line, with one planted answer sentence "
        f"(e.g. \"{planted}\") and {distractors} distractor sentences of the same template about other subjects at seeded random places, "
        f"then a blank line and the question (\"{question}\"). Every method explains the planted answer as the next token "
        f"(\"{target}\"). Precision@{k}: of the {k} highest-scored non-special prompt tokens (the question's included), "
        f"the fraction inside the planted sentence — {run.answer_tokens:.1f} tokens on average, so at most "
        f"{min(1.0, run.answer_tokens / k):.2f}; a uniformly random ranking scores about {run.answer_tokens / run.prompt_tokens:.3f}.",
        "",
        f"The model's top next token is the planted answer for **{answered} of the {n} documents ({answered / n:.0%})**; "
        "the second column keeps only those (where the model demonstrably read the planted sentence). Intervals: 95 % "
        "percentile bootstrap over documents (1000 resamples); the random baseline's values are per-document means over "
        f"its {result.spec.protocol.random_seeds} seeds.",
        "",
        f"| method | paper row | precision@{k} [95% CI] | on answered documents [95% CI] | mean hits / mean answer tokens "
        "(the paper's code) | top-1 source [95% CI] | top-3 source [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    intervals: dict[str, dict[str, tuple[float, float, float]]] = {}
    for group in result.groups:
        vals = run.values[group]
        found = {
            "all": bootstrap_mean(vals["precision_at_k"][np.isfinite(vals["precision_at_k"])]),
            "answered": bootstrap_mean(vals["precision_at_k"][run.answered & np.isfinite(vals["precision_at_k"])]),
            "top1": bootstrap_mean(vals["source_top1"][np.isfinite(vals["source_top1"])]),
            "top3": bootstrap_mean(vals["source_top3"][np.isfinite(vals["source_top3"])]),
        }
        intervals[group] = found

        paper = PAPER_ROWS.get(group, "")
        name = f"**{group}**" if group == "mask_lrp" else group
        lines.append(
            f"| {name} | {paper} | {interval_text(*found['all'])} | {interval_text(*found['answered'])} | {_fmt(run.code_ratio.get(group))} | "
            f"{interval_text(*found['top1'])} | {interval_text(*found['top3'])} |"
        )
    best = max(intervals, key=lambda g: intervals[g]["all"][0] if math.isfinite(intervals[g]["all"][0]) else -math.inf)
    pairs = overlapping({g: (v["all"][1], v["all"][2]) for g, v in intervals.items()})
    with_best = [p for p in pairs if best in p.split(" / ")]
    lines += [
        "",
        f"Precision@{k} intervals that overlap (no difference claimed): {', '.join(pairs) or 'none'}.",
        "",
        f"Highest precision@{k}: `{best}`"
        + (f"; its interval overlaps those of {', '.join(p.replace(best, '').strip(' /') for p in with_best)}." if with_best
           else ", with an interval above every other method's."),
        "",
        "The paper's Table 2, GPT-2 column (precision@20 in %, SQuAD v1.1 / v2.0, explaining a fine-tuned span-prediction "
        "head; its code divides the mean number of hits by the mean answer length, which the fifth column above "
        "computes): "
        + ", ".join(f"{row} {a:.2f} / {b:.2f}" for row, (a, b) in PAPER_TABLE2_GPT2.items())
        + ". Only the ordering of methods can be set beside ours: other model, other task (a planted sentence copied by "
        "a next-token predictor, not a span head), other data.",
        "",
        f"- head mask of `{result.model_name.rsplit('@', 1)[0]}` for `mask_lrp`: "
        + (f"{run.mask_rate:.1%} mask rate, selected as above from the movie-review train split"
           + (" (its first 1,000 texts in a quick run)" if plan.quick else "") if run.mask_rate is not None else "not run")
        + (f"; integrated gradients with {plan.ig_steps} steps" if "integrated_gradients" in plan.planted_methods else ""),
        f"- run time: the run that completed the store for this setting computed for {computed / 60:.1f} min (wall clock, "
        "shared 2-core machine)",
        *([f"- not run on these prompts: {', '.join(f'`{m}`' for m in plan.methods if m not in plan.planted_methods)} "
           "(ALTI's per-layer N x N x D decompositions of 512-token prompts through 30 blocks would cost more than the rest "
           "of the report)"] if any(m not in plan.planted_methods for m in plan.methods) else []),
        "",
    ]
    return lines


def _fmt(value: float | None, std: float | None = None, digits: int = 3) -> str:
    from heedful.evaluate.report import fmt

    return fmt(float("nan") if value is None else value, std, digits)


# ---------------------------------------------------------------------------- markdown
def _mask_section(mask, image: str) -> list[str]:
    from heedful.lrp.masks import RELATIONS

    layers, heads = mask.shape
    kept = int(mask.mask.sum())
    meta = mask.meta
    lines = [
        "## Head mask (paper Sec. 4.2, Figure 5)",
        "",
        f"- model: {layers} blocks x {heads} heads = {mask.mask.size} heads; **kept {kept} ({mask.rate:.1%} mask rate)**: "
        f"{int(mask.syntactic.any(-1).sum())} syntactic, {int(mask.positional.sum())} positional",
        f"- selected from: {meta.get('dataset', '?')} {meta.get('split', '')} split"
        + (f", {mask.statistics['texts']} texts, {mask.statistics['queries']} query tokens" if mask.statistics else "")
        + f"; parser {meta.get('parser', '?')}; xi_synt {meta.get('xi_synt', '?')}, xi_pos {meta.get('xi_pos', '?')}, "
        f"offset 0 counted as a position: {meta.get('include_self', '?')}",
        "",
        f"![layer x head map of the kept heads]({image})",
        "",
    ]
    stats = mask.statistics
    rows = []
    for layer, head in zip(*np.nonzero(mask.mask), strict=True):
        why = []
        for k, rel in enumerate(RELATIONS):
            if mask.syntactic[layer, head, k]:
                detail = ""
                if stats:
                    acc = stats["syntactic_accuracy"][layer][head][k]
                    detail = f" (accuracy {acc:.3f} > threshold {stats['baseline'][rel]['threshold']:.3f})"
                why.append(f"syntactic: {rel}{detail}")
        if mask.positional[layer, head]:
            detail = ""
            if stats:
                off = stats["positional_top_offset"][layer][head]
                freq = stats["positional_top_frequency"][layer][head]
                detail = f" (offset {off:+d} holds the attention maximum for {freq:.1%} of queries)"
            why.append(f"positional{detail}")
        rows.append(f"| {layer} | {head} | {'; '.join(why) or 'kept (no breakdown saved)'} |")
    if rows:
        lines += ["| block | head | why kept |", "|---|---|---|", *rows, ""]
    if stats:
        lines += [
            "Eq. 7 thresholds (best fixed-offset baseline + xi_synt) and the heads' best syntactic accuracy:",
            "",
            "| relation | dependents | best offset | baseline | threshold | best head (accuracy) | heads above |",
            "|---|---|---|---|---|---|---|",
        ]
        acc = np.asarray(stats["syntactic_accuracy"], dtype=float)
        for k, rel in enumerate(RELATIONS):
            base = stats["baseline"][rel]
            best = np.unravel_index(int(np.argmax(acc[..., k])), acc.shape[:2])
            lines.append(
                f"| {rel} | {stats['relation_counts'][rel]} | {base['best_offset']:+d} | {base['accuracy']:.3f} | "
                f"{base['threshold']:.3f} | block {best[0]} head {best[1]} ({acc[best[0], best[1], k]:.3f}) | "
                f"{int(mask.syntactic[..., k].sum())} |"
            )
        lines.append("")
    upper = bool(kept) and int(np.nonzero(mask.mask)[0].max()) < layers / 2
    lines += [
        "The paper shows BERT-base's masks only as maps (Figure 5: positional heads in early blocks, syntactic heads in "
        "later ones, and few heads at all on the long-text data) and gives no mask rate."
        + (" Here every kept head sits in the lower half of the network; no head of the upper blocks passes either test."
           if upper else ""),
        "",
    ]
    return lines


def _dataset_table(run: _DatasetRun, methods: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Table 1 analogue of one data set, with the paired paper column, and what the orderings say.
    The paper's "Ours" and "Random" rows are the literal variant; the authors' code's variant is
    shown beside them, unranked."""
    paper_col = PAIRED.get(Path(run.dataset).stem)
    rows = [m for m in PAPER_ROWS if m == RANDOM_MASK or m in methods]
    ours = {m: {metric: _ours(run, m, metric) for metric in ("aopc", "log_odds")} for m in rows}
    paper = {m: PAPER_TABLE1[PAPER_ROWS[m]].get(paper_col) if paper_col else None for m in rows}
    ours_aopc = {m: ours[m]["aopc"][0] for m in rows}
    ours_lodds = {m: ours[m]["log_odds"][0] for m in rows}
    paper_aopc = {m: paper[m][0] for m in rows if paper[m]}
    paper_lodds = {m: paper[m][1] for m in rows if paper[m]}
    r_ours_a, r_ours_l = _ranks(ours_aopc, True), _ranks(ours_lodds, False)
    r_pap_a, r_pap_l = _ranks(paper_aopc, True), _ranks(paper_lodds, False)
    col = paper_col or "–"
    lines = [
        f"### {run.name} ({run.result.spec.split}, n = {run.result.n_examples}) beside the paper's {col}",
        "",
        f"| paper row [heedful method] | AOPC ↑ ours [95% CI] | LOdds ↓ ours [95% CI] | AOPC ↑ paper {col} | LOdds ↓ paper {col} | "
        "rank AOPC ours / paper | rank LOdds ours / paper |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(m: str, metric: str) -> str:
        value, std = _ours(run, m, metric)
        _, low, high = _interval(run, m, metric)
        return f"{_fmt(value, std)} [{_fmt(low)}, {_fmt(high)}]"

    for m in rows:
        p = paper[m]
        pa = _fmt(p[0], p[2]) if p else "–"
        pl = _fmt(p[1], p[3]) if p else "–"
        name = f"**{PAPER_ROWS[m]}** [`mask_lrp`, Eq. 10 as written]" if m == "mask_lrp" else (
            f"{PAPER_ROWS[m]} [`mask_lrp`, random heads, Eq. 10 as written]" if m == RANDOM_MASK else f"{PAPER_ROWS[m]} [`{m}`]"
        )
        lines.append(
            f"| {name} | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | {pa} | {pl} | "
            f"{r_ours_a.get(m, '–')} / {r_pap_a.get(m, '–')} | {r_ours_l.get(m, '–')} / {r_pap_l.get(m, '–')} |"
        )
    for m, name in ((ALL_HEADS, "Ours, E_h over all heads [`mask_lrp`, Eq. 10 as written, `heads_mean=\"all\"`]"),
                    (REFERENCE, "Ours, the authors' code [`mask_lrp`, `variant=\"reference\"`]"),
                    (RANDOM_REFERENCE, "Random, the authors' code [`mask_lrp`, `variant=\"reference\"`, random heads]")):
        if m in run.variants:
            lines.append(f"| {name} | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | – | – | – | – |")
    for m in [m for m in methods if m not in PAPER_ROWS]:
        lines.append(f"| *not in the paper:* `{m}` ({EXTRA_NOTES.get(m, '')}) | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | – | – | – | – |")
    lines += [
        "",
        "Intervals: 95 % percentile bootstrap over the examples (1000 resamples). Random masks: mean ± std over the "
        "seeds' means, the interval from the per-example means over the seeds; `random`: likewise over its seeds of "
        "random token scores. Ranks are among the paper's ten rows only (Ours and Random = Eq. 10 as written); values "
        "equal to three decimals share a rank.",
        "",
    ]
    found = {
        "paper_col": paper_col,
        "ours_aopc": ours_aopc,
        "ours_lodds": ours_lodds,
        "paper_aopc": paper_aopc,
        "paper_lodds": paper_lodds,
        "rank_ours_aopc": r_ours_a,
        "rank_ours_lodds": r_ours_l,
    }
    return lines, found


def _ordering_notes(run: _DatasetRun, found: dict[str, Any]) -> list[str]:
    """Where our ordering agrees with the paper's and where not, from the numbers."""
    col = found["paper_col"]
    oa, ol = found["ours_aopc"], found["ours_lodds"]
    pa, pl = found["paper_aopc"], found["paper_lodds"]
    lines = [f"**{run.name} vs the paper's {col}:**", ""]
    if not col:
        return lines + ["- no paper column to compare with.", ""]
    best_a = [PAPER_ROWS[m] for m, r in found["rank_ours_aopc"].items() if r == 1]
    best_l = [PAPER_ROWS[m] for m, r in found["rank_ours_lodds"].items() if r == 1]
    rank_a, rank_l = found["rank_ours_aopc"].get("mask_lrp"), found["rank_ours_lodds"].get("mask_lrp")
    paper_best_a = [PAPER_ROWS[m] for m, r in _ranks(pa, True).items() if r == 1]
    paper_best_l = [PAPER_ROWS[m] for m, r in _ranks(pl, False).items() if r == 1]
    paper_rank_a, paper_rank_l = _ranks(pa, True).get("mask_lrp"), _ranks(pl, False).get("mask_lrp")
    lines.append(
        f"- best of the paper's rows here: {' = '.join(best_a)} by AOPC, {' = '.join(best_l)} by LOdds (paper: "
        f"{' = '.join(paper_best_a)} by AOPC, {' = '.join(paper_best_l)} by LOdds); Mask-LRP ranks {rank_a} by AOPC "
        f"and {rank_l} by LOdds of {len(found['rank_ours_aopc'])} (paper: {paper_rank_a} and {paper_rank_l}) — "
        + ("**agrees**." if (rank_a, rank_l) == (paper_rank_a, paper_rank_l) else "**differs**.")
    )
    comparisons = [("mask_lrp", "chefer", "Mask-LRP minus GAE (all heads, `chefer`)"),
                   ("mask_lrp", RANDOM_MASK, "Mask-LRP minus the random-mask rollout"),
                   (REFERENCE, "chefer", "the authors' code minus GAE"),
                   (REFERENCE, RANDOM_REFERENCE, "the authors' code minus its random-mask rollout"),
                   ("mask_lrp", REFERENCE, "Eq. 10 as written minus the authors' code"),
                   (ALL_HEADS, "chefer", "Mask-LRP with E_h over all heads minus GAE"),
                   (ALL_HEADS, "mask_lrp", "E_h over all heads minus E_h over the kept heads")]
    for a, b, label in comparisons:
        if _values(run, a, "aopc") is None or _values(run, b, "aopc") is None:
            continue
        text, da, dl = _verdict(run, a, b)
        paper = ""
        if a == "mask_lrp" and b in pa:
            paper = f" (paper: AOPC {pa['mask_lrp'] - pa[b]:+.3f}, LOdds {pl['mask_lrp'] - pl[b]:+.3f})"
        lines.append(f"- {label}, paired over the examples: AOPC {interval_text(*da, sign=True)}, LOdds {interval_text(*dl, sign=True)}{paper} — {text}.")
    rho_a, rho_l = spearman(oa, pa, minimum=3), spearman(ol, pl, minimum=3)
    ca, ta = _concordance(oa, pa)
    cl, tl = _concordance(ol, pl)
    lines.append(
        f"- rank agreement over the {len(oa)} rows: Spearman rho {rho_a:.2f} (AOPC), {rho_l:.2f} (LOdds); "
        f"method pairs ordered as in the paper: {ca}/{ta} (AOPC), {cl}/{tl} (LOdds)."
    )
    disagree = []
    for m in oa:
        if m not in pa:
            continue
        diff = found["rank_ours_aopc"].get(m, 0) - _ranks(pa, True).get(m, 0)
        if abs(diff) >= 3:
            disagree.append(f"{PAPER_ROWS[m]} ({'lower' if diff > 0 else 'higher'} here: rank {found['rank_ours_aopc'][m]} vs {_ranks(pa, True)[m]})")
    if disagree:
        lines.append("- largest rank moves (AOPC, 3 places or more): " + "; ".join(disagree) + ".")
    lines.append("")
    return lines


def _headline_section(runs: list[_DatasetRun], methods: list[str]) -> list[str]:
    """Every method and Mask-LRP variant ordered by its mean, with 95 % bootstrap intervals, and
    whether the intervals of neighbours in that order overlap."""
    lines = [
        "## Headline ordering with 95 % bootstrap intervals",
        "",
        "Methods ordered by their mean over the examples, best first; an interval that overlaps the next method's "
        "means the two are not told apart at this n (unpaired intervals; the paired differences above are sharper).",
        "",
    ]
    rows = [*methods, *VARIANT_ROWS]
    for run in runs:
        for metric, title, better_high in (("aopc", "AOPC ↑", True), ("log_odds", "LOdds ↓", False)):
            found = {m: _interval(run, m, metric) for m in rows}
            order = sorted((m for m in rows if math.isfinite(found[m][0])), key=lambda m: found[m][0], reverse=better_high)
            lines += [f"**{run.dataset}, {title}** (n = {run.result.n_examples}):", "",
                      "| rank | method | mean [95% CI] | overlaps the next |", "|---|---|---|---|"]
            overlaps = []
            for i, m in enumerate(order):
                nxt = order[i + 1] if i + 1 < len(order) else None
                over = nxt is not None and found[m][1] <= found[nxt][2] and found[nxt][1] <= found[m][2]
                if over:
                    overlaps.append(f"{m} / {nxt}")
                name = f"**{m}**" if m == "mask_lrp" else m
                lines.append(f"| {i + 1} | {name} | {interval_text(*found[m])} | {'yes' if over else 'no' if nxt else '–'} |")
            lines += ["", "Adjacent pairs whose intervals overlap: " + (", ".join(overlaps) or "none") + ".", ""]
    return lines


def _processor() -> str:
    """The processor and the kernels PyTorch runs on it, e.g. ``AMD EPYC, PyTorch's AVX512 kernels``
    (the kernels, not the processor's flags, decide the rounding)."""
    import torch

    return f"{cpuinfo()[0] or 'processor'}, PyTorch's {torch.backends.cpu.get_cpu_capability()} kernels"


def _sample_text(run: _DatasetRun, asked: int) -> str:
    """Which examples of ``run``'s split were explained: the first ``asked`` long enough, or all
    of them when the split has fewer."""
    r = run.result
    if r.n_examples < asked:
        return (f"all {r.n_examples} {r.spec.split} texts of {run.dataset} that are 20 tokens or longer "
                f"(of {r.n_examples + sum(r.skipped.values())}; {asked} asked for)")
    return f"the first {r.n_examples} {r.spec.split} texts of {run.dataset} that are 20 tokens or longer"


def _curve_tables(run: _DatasetRun, methods: list[str]) -> list[str]:
    x = [f"{100 * v:.0f}%" for v in run.result.x]
    lines = []
    for metric, title in (("aopc", "AOPC"), ("log_odds", "LOdds")):
        lines += [f"{title} per k on {run.dataset}:", "", "| method | " + " | ".join(x) + " | mean |", "|" + "---|" * (len(x) + 2)]
        for m in methods:
            curve, _ = _curve(run, m, metric)
            if curve is None:
                continue
            value, _ = _ours(run, m, metric)
            cells = " | ".join(_fmt(v) for v in curve)
            lines.append(f"| {'**mask_lrp**' if m == 'mask_lrp' else m} | {cells} | {_fmt(value)} |")
        lines.append("")
    if run.result.spec.protocol.skip_lowest:
        lines += ["At 100 % each method's input still holds its lowest-ranked token (the authors' code never removes it), "
                  "so the last column differs between methods.", ""]
    return lines


def _sensitivity_rows(runs: list[_DatasetRun]) -> list[str]:
    lines = [
        "| data | explanations compared | examples | same removal order | mean Spearman rho | largest score change (relative) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for label, sens in run.sensitivity.items():
            lines.append(
                f"| {run.dataset} | {label} | {sens['examples']} | {sens['same_order']:.1%} | {sens['spearman']:.4f} | "
                f"{sens['max_rel_diff']:.2e} |"
            )
    return [*lines, ""]


def _ablation_section(runs: list[_DatasetRun], mask, image: str) -> list[str]:
    kept = int(mask.mask.sum())
    total = mask.mask.size
    seeds = len(runs[0].variants[RANDOM_MASK].keys)
    lines = [
        "## Ablation: random head masks of the same rate (paper Table 1 \"Random\", Sec. 5.4)",
        "",
        f"Mask-LRP with {kept} heads drawn at random from the {total} (`ablation=\"random\"`, seeds 0..{seeds - 1}), "
        "in both variants, against the selected mask and against all heads (`chefer`). A random mask shares on "
        f"average {kept * kept / total:.2f} heads with the selected one. Differences are paired over the examples "
        "(per-example values of the random masks averaged over the seeds), with 95 % bootstrap intervals.",
        "",
        f"![random masks vs the selected mask]({image})",
        "",
        "| data | variant | metric | selected mask [95% CI] | random masks: mean ± std over seeds (per seed) | all heads (`chefer`) | "
        "selected − random [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for run in runs:
        for real, rand, name in (("mask_lrp", RANDOM_MASK, "Eq. 10 as written"), (REFERENCE, RANDOM_REFERENCE, "the authors' code")):
            for metric, label in (("aopc", "AOPC ↑"), ("log_odds", "LOdds ↓")):
                v = run.variants[rand]
                per = ", ".join(f"{x:.4f}" for x in v.seed_means[metric])
                diff = _difference(run, real, rand, metric)
                lines.append(
                    f"| {run.dataset} | {name} | {label} | {interval_text(*_interval(run, real, metric), 4)} | "
                    f"{_fmt(v.mean(metric), v.std(metric), digits=4)} ({per}) | {_fmt(_ours(run, 'chefer', metric)[0], digits=4)} | "
                    f"{interval_text(*diff, 4, sign=True)} |"
                )
            verdicts.append(f"{run.dataset}, {name}: selected vs random masks — {_verdict(run, real, rand)[0]}")
    lines += ["", *[f"- {v}." for v in verdicts], ""]
    lines += [
        "How much the head mask and the variant move the token scores: explanations compared example by example, "
        "non-special tokens; \"same removal order\": the protocol removes the tokens in exactly the same order. "
        "\"no head kept\" is a mask of zeros (explanations only, no curves): in Eq. 10 as written every layer's map is "
        "then 0, the rollout is the identity and every score 0.",
        "",
        *_sensitivity_rows(runs),
    ]
    return lines


def _corruption_section(run: _DatasetRun, image: str) -> list[str]:
    """Figure 4 analogue: the corrupted masks' AOPC / LOdds against the rate, with the trend."""
    seeds = len(next(v for k, v in run.variants.items() if k.startswith("mask_lrp (corrupted")).keys)
    lines = [
        "## Mask corruption (paper Figure 4)",
        "",
        "The paper: \"we randomly switched a portion of the remaining zeros in M_ours ... If our method employs a 100% "
        "corrupted mask (a mask filled with ones), it degenerates to GAE\" — i.e. a share of the *unselected* heads is "
        "switched on, the selected heads stay. heedful's `ablation=\"corrupted\"` (`heedful.lrp.masks.corrupted_mask`) is "
        "exactly that (the kept heads are not replaced by random ones; that is the `random` ablation above). Rates "
        f"{', '.join(f'{r:.0%}' for r in CORRUPTION_RATES)} with {seeds} seed{'s' if seeds > 1 else ''} each (per-example "
        "values averaged over the seeds); 0 % is the selected mask, 100 % a mask of ones, which in Eq. 10 as written *is* `chefer` (tested to "
        f"1e-5), so its point is `chefer`'s run. {run.dataset}, n = {run.result.n_examples}; bands: 95 % bootstrap "
        "intervals over the examples.",
        "",
        f"![mask corruption]({image})",
        "",
        "| corruption rate | heads kept (mean) | AOPC ↑ [95% CI] | LOdds ↓ [95% CI] |",
        "|---|---|---|---|",
    ]
    for (rate, a), (_, lo) in zip(_corruption_points(run, "aopc"), _corruption_points(run, "log_odds"), strict=True):
        heads = 1.0 if rate == 1.0 else run.variants[_corrupted_label(rate) if rate else REFERENCE].rate
        lines.append(f"| {rate:.0%} | {heads:.1%} | {interval_text(*a)} | {interval_text(*lo)} |")
    rho_a, rho_l = _corruption_trend(run)
    ends = _verdict(run, "mask_lrp", "chefer")
    lines += [
        "",
        f"Trend over the rates: Spearman rho of the mean against the rate {rho_a:+.2f} (AOPC; the paper: falling, "
        f"i.e. negative) and {rho_l:+.2f} (LOdds; the paper: rising). Selected mask (0 %) minus all heads (100 %), paired: "
        f"AOPC {interval_text(*ends[1], sign=True)}, LOdds {interval_text(*ends[2], sign=True)} — {ends[0]}.",
        "",
    ]
    return lines


def _cost_table(runs: list[_DatasetRun], methods: list[str]) -> list[str]:
    lines = [
        "## Cost per example (explanation only; from the results store, summed over the runs that computed it)",
        "",
        "| method | " + " | ".join(f"{r.dataset} s / ex" for r in runs) + " | forward / ex | backward / ex | peak MB |",
        "|" + "---|" * (len(runs) + 4),
    ]
    for m in [*methods, *VARIANT_ROWS]:
        try:
            costs = [_cost(r, m) for r in runs]
        except KeyError:
            continue
        c0 = costs[0]
        lines.append(
            f"| {m} | " + " | ".join(_fmt(c.get("seconds"), digits=4) for c in costs)
            + f" | {_fmt(c0.get('forward'), digits=1)} | {_fmt(c0.get('backward'), digits=1)} | {_fmt(c0.get('peak_mb'), digits=0)} |"
        )
    lines += [
        "",
        "Wall seconds on a shared 2-core CPU, one torch thread, batches of 16; the numbers vary with the load of the machine. "
        "The perturbation curves (9 forward passes per example and method) are not included.",
        "",
    ]
    return lines


PAPER_EXPERIMENTS: tuple[tuple[str, str, str], ...] = (
    ("Table 1: AOPC and LOdds of the eight baselines, Mask-LRP and the random mask on SST-2 and Yelp (BERT-base)",
     "analogue", "MiniLM-L6 (`minilm-sentiment`) on the movie snippets (beside SST-2) and the product snippets (beside "
     "Yelp), the paper's protocol (`mask-lrp` preset), both Mask-LRP variants and both readings of Eq. 10's E_h; the "
     "same on a deeper classifier (`smollm2-sentiment`, 30 blocks, movie snippets) with its own head mask"),
    ("Table 1: the IMDB, MNLI and QQP columns", "not reproduced",
     "no such data or classifier ships here (docs: MODELS.md)"),
    ("Table 2: precision@20 on SQuAD v1/v2 with BERT, GPT-2 and RoBERTa", "analogue",
     "token precision@20 on planted long contexts with `smollm2-135m` (no QA data ships here)"),
    ("Table 3: Mask-LRP without positional or without syntactic heads (SST-2, QQP)", "analogue",
     "both ablations, AOPC and LOdds with 95 % intervals and the paired difference from the whole mask, on every "
     "data set and on the deeper classifier, beside the paper's SST-2 and QQP numbers (no sentence-pair data here)"),
    ("Table 4: against ALTC", "analogue", "heedful's `alti` (Ferrando et al. 2022) as a row of Table 1"),
    ("Figure 3: AOPC and LOdds against k, the share of tokens removed", "reproduced",
     "every method's curves per data set, with the deletion curve beside them"),
    ("Figure 4: corrupting the head mask, from the selected heads to GAE", "reproduced",
     "corruption rates 10 %, 25 %, 50 % on the first data set, with the threshold sweep"),
    ("Figure 5: the syntactic and positional heads per layer", "reproduced", "the head map of the model's mask"),
    ("Figure 6: Mask-LRP's scores minus each baseline's on one positive sentence", "reproduced",
     "one positive movie-review test sentence (seeded choice), a row per baseline and per Table 3 ablation, words "
     "green where Mask-LRP scores higher and red where lower (`mask-lrp-figure6.png`); the words the paper reads off "
     "its sentence (*charming*, *journey*) are of another sentence"),
    ("Appendix figures 7-13 (the same comparison on MNLI, IMDB and Yelp)", "not reproduced",
     "Figure 6's drawing on further single examples of data sets not shipped here (MNLI, IMDB, Yelp); "
     "`heedful explain TEXT --method mask_lrp --html page.html` draws one for any text"),
    ("Random head masks of the same rate (Table 1 \"Random\", Sec. 5.4)", "reproduced",
     "random masks at the selected mask's rate (`mask_seeds` of them), both variants"),
    ("Relevance conservation under the mask (Sec. 4.3)", "reproduced",
     "the per-block relevance sums of both variants on the first data set"),
)
"""Every experiment, table and figure of the paper and how this report covers it."""


def _described(name: str) -> str:
    """A zoo model's one-line description, else 'a model folder'."""
    from heedful import zoo

    entry = zoo.ENTRIES.get(name)
    return entry.description if entry is not None else "a model folder"


def _coverage(deep: Any, figure6: bool) -> list[tuple[str, str, str]]:
    """:data:`PAPER_EXPERIMENTS` as this run covered them: without the deeper classifier's note
    when it did not run, Figure 6 "not reproduced" when no sentence could be drawn."""
    rows = []
    for what, status, how in PAPER_EXPERIMENTS:
        if what.startswith("Table 1: AOPC") and (deep is None or deep.run is None):
            how = how.split("; the same on a deeper")[0] + ("" if deep is None else f"; not on a deeper classifier: {deep.missing}")
        if what.startswith("Figure 6") and not figure6:
            status, how = "not reproduced", "no positive example of at most 30 words in this run's first data set"
        rows.append((what, status, how))
    return rows


def _markdown(
    plan: _Plan,
    runs: list[_DatasetRun],
    mask,
    files: dict[str, str],
    seconds: float,
    planted: _PlantedRun | None = None,
    conservation: dict[str, dict[str, float]] | None = None,
    deep: Any = None,
    figure: Any = None,
    deep_lines: list[str] | None = None,
) -> str:
    """The report but its claims table: ``deep`` the deeper classifier's run
    (:class:`~heedful.reproduce.mask_lrp.deep._DeepRun`, None when left out) and ``deep_lines``
    its section (:func:`~heedful.reproduce.mask_lrp.deep._deep_section`, which reads this
    module's tables), ``figure`` Figure 6's sentence
    (:class:`~heedful.reproduce.mask_lrp.figure6._Figure6`, drawn at ``files["figure6"]``)."""
    from heedful.reproduce.mask_lrp.figure6 import _figure6_section
    from heedful.reproduce.mask_lrp.readings import _heads_mean_section, _table3_section

    protocol = runs[0].result.spec.protocol
    methods = [m for m in plan.methods if m in runs[0].result.groups]
    model_name = runs[0].result.model_name
    deep_run = [deep.run] if deep is not None and deep.run is not None else []
    times = _timings(plan, [*runs, *deep_run])
    computed = sum(times.get(_time_label(r, plan.split), r.seconds) for r in [*runs, *deep_run])
    lines = [
        "# Mask-LRP reproduction: Table 1 analogue, AOPC / LOdds against k, head map",
        "",
        "Regenerate with `heedful reproduce mask-lrp`"
        + (" (this file: `--quick` smoke run — **its numbers are not the report's**)" if plan.quick else "")
        + ". Paper: Song et al. 2024, *Better Explain Transformers by Illuminating Important Information* "
        "(Mask-LRP). Method: `mask_lrp` — Chefer et al.'s relevance rollout with the relevance of every head "
        "outside a selected set of syntactic and positional heads cut during the relevance pass. Two variants: "
        "**Eq. 10 as written** (`variant=\"literal\"`, the default: the kept heads' relevance renormalised so each "
        "block conserves relevance, the rollout averaging the kept heads only) and **the authors' code** "
        "(`variant=\"reference\"`: no renormalisation, the rollout over every head's map of the unmasked relevance). "
        "The paper's \"Ours\" and \"Random\" rows are the first; the second is shown beside them, and so is the "
        "first with Eq. 10's E_h read as the mean over all heads instead of the kept ones (`heads_mean=\"all\"`), a "
        "reading the paper leaves open. Besides the main model: the same Table 1 on a deeper classifier, Table 3 in "
        "full and Figure 6.",
        "",
        "## Setting",
        "",
        f"- model: `{model_name}` ({mask.shape[0]} blocks x {mask.shape[1]} heads) — the paper uses BERT-base (12 x 12), "
        "one fine-tuned checkpoint per data set",
    ]
    for run in runs:
        r = run.result
        skipped = ", ".join(f"{k}: {v}" for k, v in r.skipped.items()) or "none"
        lines.append(
            f"- data: `{run.dataset}` {r.spec.split} split, {DATASET_NOTES.get(Path(run.dataset).stem, 'user data')}; "
            f"**n = {r.n_examples}** (first examples kept by the protocol; skipped before the cut: {skipped})"
        )
    if deep is not None:
        lines.append(
            f"- deeper classifier: `{deep.model}` on `{plan.datasets[0]}`, "
            + (f"**n = {deep.run.result.n_examples}**, its own head mask ({int(deep.mask.mask.sum())} of {deep.mask.mask.size} "
               f"heads kept); section \"Table 1 on a deeper classifier\"" if deep.run is not None else f"not run: {deep.missing}")
        )
    lines += [
        f"- protocol `{protocol.name}` (hash `{protocol.hash()}`): {protocol.citation}. Gold label explained and watched; "
        "tokens removed in descending score order, [CLS]/[SEP] never removed, replaced by id 0 ([PAD]), length kept, "
        "segment ids all zero; k = unique(round(linspace(0, 1, 10) · N))[1:] with N counting special tokens "
        "(nominal 11 % … 100 %)" + ("; as in the authors' code the lowest-ranked token is never removed, so the input "
                                    "at 100 % keeps one token, which depends on the method" if protocol.skip_lowest else "")
        + "; AOPC = mean over k of p(gold | x) − p(gold | x̃_k), LOdds = mean over k of "
        "log p(gold | x̃_k) / p(gold | x); examples under 20 tokens skipped",
        f"- head mask: {int(mask.mask.sum())} of {mask.mask.size} heads kept (**mask rate {mask.rate:.1%}**), see below",
        f"- seeds: random head masks {plan.mask_seeds} (seeds 0..{plan.mask_seeds - 1}); corrupted masks "
        f"{plan.corruption_seeds} per rate; random token scores "
        f"{protocol.random_seeds}; integrated gradients with {plan.ig_steps} Gauss-Legendre steps",
        f"- run time: the run that completed the store for this n computed for {computed / 60:.1f} min ("
        + ", ".join(f"{r.name} {times.get(_time_label(r, plan.split), r.seconds) / 60:.1f} min" for r in [*runs, *deep_run])
        + f", wall clock on a shared 2-core machine under the load of other jobs, on top of whatever earlier runs had stored); writing this file took {seconds / 60:.1f} min, reusing the "
        "explanations and curves kept in the results store. The explanations' own cost per example is in the cost "
        "table below; on top of it every method run measures 9 perturbed forward passes per example",
        "",
        "## Table 1 analogue",
        "",
        "The paper's numbers are for BERT-base on SST-2 / IMDB / Yelp validation or test data; ours are for a smaller "
        "model on other, shorter texts, so only orderings can be compared, not values. Paper row \"GAE\" is Chefer et "
        "al. 2021a's relevance rollout (its code's `generate_LRP`), heedful's `chefer`; heedful's `gae` (Chefer et al. "
        "2021b) is listed among the extra methods. Paper row \"Random\" is Mask-LRP with a random head mask of the same "
        "rate (mean ± std over seeds), not random token scores.",
        "",
    ]
    notes = []
    for run in runs:
        table, found = _dataset_table(run, methods)
        lines += table
        notes += _ordering_notes(run, found)
    lines += ["### Where the orderings agree and differ", "", *notes]
    lines += _headline_section(runs, methods)
    lines += [
        "The paper's full Table 1 (BERT-base) for the single-text data sets, for reference:",
        "",
        "| paper row | SST-2 AOPC | SST-2 LOdds | IMDB AOPC | IMDB LOdds | Yelp AOPC | Yelp LOdds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, cols in PAPER_TABLE1.items():
        cells = []
        for col in ("SST-2", "IMDB", "Yelp"):
            a, lo, a_sd, lo_sd = cols[col]
            cells += [_fmt(a, a_sd), _fmt(lo, lo_sd)]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += deep_lines or []
    lines += _heads_mean_section([*runs, *deep_run])
    lines += _table3_section([*runs, *deep_run])
    lines += ["## AOPC and LOdds against k (paper Figure 3)", ""]
    for run in runs:
        lines += [f"![AOPC and LOdds against k on {run.dataset}]({files['curves-' + run.dataset]})", ""]
        lines += _curve_tables(run, [*methods, *VARIANT_ROWS])
    lines += [
        "## Deletion curves",
        "",
        "Mean probability of the gold label as the top-k tokens are replaced; k = 0 is the intact input. "
        "The area under it is heedful's `deletion` metric (lower is better):",
        "",
        f"![deletion curves]({files['deletion']})",
        "",
        "| method | " + " | ".join(f"{r.dataset} deletion area ↓" for r in runs) + " |",
        "|" + "---|" * (len(runs) + 1),
    ]
    for m in [*methods, *VARIANT_ROWS]:
        cells = [_fmt(*_ours(r, m, "deletion")) for r in runs]
        lines.append(f"| {'**mask_lrp**' if m == 'mask_lrp' else m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _mask_section(mask, files["heads"])
    lines += _figure6_section(figure, runs[0], files.get("figure6"))
    lines += _ablation_section(runs, mask, files["ablation"])
    if "corruption" in files:
        lines += _corruption_section(runs[0], files["corruption"])
    lines += _why_section(runs, mask, planted, conservation or {})
    if planted is not None:
        lines += _planted_section(plan, planted)
    lines += _cost_table(runs, methods)
    lines += [
        *coverage_section(_coverage(deep, "figure6" in files)),
        "## Differences from the paper's setting",
        "",
        f"- Model and data: `{model_name.rsplit('@', 1)[0]}` ({mask.shape[0]} blocks) and "
        + ("VADER's snippet sets" if all(Path(r.dataset).stem in PAIRED for r in runs) else "the data named above")
        + " instead of BERT-base checkpoints per data set and SST-2 / IMDB / Yelp / MNLI / QQP; no sentence-pair data, "
        "and no SQuAD: "
        + ("precision@20 is measured on planted long contexts with a causal LM instead (section above)."
           if planted is not None else "precision@20 is not measured (planted section left out)."),
        f"- n: {', '.join(f'{r.dataset} {r.result.n_examples}' for r in runs)} examples: "
        + ", ".join(_sample_text(r, plan.n_for(r.dataset)) for r in runs)
        + " (the paper uses whole validation / test sets). Standard error of Mask-LRP's mean AOPC over the examples: "
        + ", ".join(f"{r.dataset} {_standard_error(r, 'mask_lrp', 'aopc'):.3f}" for r in runs)
        + "; every comparison above carries a 95 % bootstrap interval, paired over the examples where two methods are "
        "compared; the random-mask std is over seeds, not over examples.",
        "- Mask-LRP itself: the default `mask_lrp` follows Sec. 4.3 as written — the kept heads' relevance "
        "renormalised in the A·V step so that each block conserves relevance (a block with no kept head passes "
        "everything down its residual, the only way left to conserve it), and Eq. 10's mean over the kept heads "
        "only -- a reading: the mean over all heads, the cut ones adding 0 (`heads_mean=\"all\"`), is shown beside it "
        "(section \"E_h over the kept heads or over all heads\"). The authors' code (ExplanationGenerator.MGAE), kept as `variant=\"reference\"`, differs: no "
        "renormalisation (the cut heads' relevance is lost, see the conservation table), the rollout's maps taken "
        "from the *unmasked* head relevance (unhalved) and averaged over every head. The paper's separate "
        "normalisation of R_synt and R_pos is one factor here (the same when their sums share a sign).",
        "- Head statistics: spaCy's parser instead of Stanza; statistics from the movie-review train split "
        "(the data the zoo model was fine-tuned on); the Eq. 7 baseline lambda_k is our reading of the paper "
        "(best fixed-offset accuracy per relation).",
        f"- Figure 4 (mask corruption) and the threshold sweep run on {runs[0].dataset} only (the paper: SST-2); "
        "Table 3 on every data set and on the deeper classifier (the paper: SST-2 and QQP); Figure 6 on one "
        f"{runs[0].dataset} sentence (the paper: one SST-2 sentence); Table 4's ALTC is heedful's `alti` (Ferrando et "
        "al. 2022) when it is among the methods.",
        *([f"- The deeper classifier `{deep.model}` ({_described(deep.model)}) is not a BERT-style encoder: a decoder "
           "classifier is explained at its last token, where it reads, and removed tokens take id 0 as in the paper's "
           "protocol, whatever that id stands for in its vocabulary (BERT's [PAD])."]
          if deep is not None and deep.run is not None else []),
        f"- Processor: this run's {_processor()}. The rows of `lrp`, `chefer` (GAE), `mask_lrp` (both "
        "variants) and, less, `partial_lrp` are this processor's: Chefer's z-rule shares divide by sums that can cancel, "
        "so their token orders move with the processor's kernels, unlike the other methods here (`benchmarks/results/processor-stability.md`: "
        "AVX-512 against AVX2 kernels; `heedful.lrp.rules`).",
        "",
        "## Protocol fields",
        "",
        "| field | value |",
        "|---|---|",
        *[f"| {k} | `{v}` |" for k, v in protocol.describe()],
        "",
    ]
    return "\n".join(lines)
