"""Tables and plots of a :class:`~heedful.evaluate.bench.BenchResult`: a rich table for the
terminal, markdown and CSV files, and PNG plots of the per-ratio curves (AOPC, accuracy, ...)
against the perturbation ratio, one line per method, in the style of the NormXLogit paper's
figures (markers per method, the random baseline with its band of +- one std over seeds).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np

from heedful.evaluate.bench import BenchResult
from heedful.evaluate.metrics import METRICS

# Colours and markers of the NormXLogit figures (Experiment 1 notebook), by method.
STYLE: dict[str, tuple[str, str]] = {
    "random": ((0.333, 0.659, 0.408), "s"),
    "saliency": ((0.298, 0.447, 0.690), "D"),
    "grad_x_input": ((0.867, 0.518, 0.322), "*"),
    "integrated_gradients": ("#d92eb9", "v"),
    "normxlogit": ("red", "o"),
    "decompx": ("#7a8282", "X"),
    "embedding_norm": ("#43b3cc", "P"),
    "logat": ("#8c564b", "^"),
}
_FALLBACK_MARKERS = "<>hp8dH"
DISPLAY = {
    "random": "Random Baseline",
    "saliency": "Gradient Norm",
    "grad_x_input": "Gradient×Input",
    "integrated_gradients": "Integrated Gradients",
    "normxlogit": "NormXLogit",
    "embedding_norm": "ℓ2 norm",
    "logat": "LogAt",
    "decompx": "DecompX",
}
Y_LABELS = {
    "aopc": "Comprehensiveness - Confidence Drop (AOPC)",
    "sufficiency": "Sufficiency - Confidence Drop",
    "accuracy": "Accuracy",
    "accuracy_drop": "Accuracy drop",
    "log_odds": "Log-odds",
    "pearson": "Pearson r",
    "pearson_drop": "Pearson r drop",
    "deletion": "Output (deletion curve)",
    "insertion": "Output (insertion curve)",
}


def short_model(name: str) -> str:
    """``/a/b/model@1a2b3c4d`` -> ``model`` (folder name without the fingerprint)."""
    base = name.rsplit("@", 1)[0]
    return Path(base).name or base


def slug(result: BenchResult) -> str:
    """File stem for a run: model, dataset, split, protocol."""
    model = short_model(result.model_name)
    raw = f"{model}__{Path(result.spec.dataset).stem}-{result.spec.split}__{result.spec.protocol.name.rstrip('*')}"
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", raw)


def fmt(value: float | None, std: float | None = None, digits: int = 3) -> str:
    """``0.123 ± 0.004`` (``–`` for a missing or non-finite value)."""
    if value is None or not math.isfinite(value):
        return "–"
    text = f"{value:.{digits}f}"
    if std is not None and math.isfinite(std):
        text += f" ± {std:.{digits}f}"
    return text


def _arrow(metric: str) -> str:
    return "↑" if METRICS[metric].higher_is_better else "↓"


def summary_rows(result: BenchResult) -> list[dict]:
    """One row per method: metric values (random: mean ± std over seeds) and cost."""
    rows = []
    for group, res in result.groups.items():
        row = {"method": group, "seeds": res.seeds}
        for name, summary in res.summaries.items():
            row[name] = summary.value
            row[f"{name}_std"] = summary.std if res.seeds > 1 else float("nan")
            row[f"{name}_n"] = summary.n
        row.update({f"cost_{k}": v for k, v in res.cost.items()})
        rows.append(row)
    return rows


def _ratio_label(result: BenchResult, x: float) -> str:
    if result.spec.protocol.schedule == "count":
        return f"k={int(x)}"
    return f"{100 * x:.0f}%"


def rich_table(result: BenchResult):
    """Metrics as rows, methods as columns (random: mean ± std over seeds), then the cost rows."""
    from rich.table import Table

    names = list(next(iter(result.groups.values())).summaries) if result.groups else []
    p = result.spec.protocol
    table = Table(
        title=f"{short_model(result.model_name)} · {Path(result.spec.dataset).name} ({result.spec.split}, "
        f"n={result.n_examples}) · protocol {p.name}",
        caption="random: mean ± std over seeds · cost per example: wall seconds, forward / backward passes; "
        "peak RSS while explaining",
    )
    table.add_column("", style="bold", no_wrap=True)
    for group in result.groups:
        table.add_column(group, justify="right")
    for k, name in enumerate(names):
        table.add_row(
            f"{name} {_arrow(name)}",
            *[fmt(r.summaries[name].value, r.summaries[name].std if r.seeds > 1 else None) for r in result.groups.values()],
            end_section=k == len(names) - 1,
        )
    costs = (("s / example", "seconds", 4), ("forward / ex", "forward", 1), ("backward / ex", "backward", 1), ("peak MB", "peak_mb", 0))
    for label, field_name, digits in costs:
        table.add_row(label, *[fmt(r.cost[field_name], digits=digits) for r in result.groups.values()], style="dim")
    return table


def markdown(result: BenchResult) -> str:
    p = result.spec.protocol
    names = list(next(iter(result.groups.values())).summaries) if result.groups else []
    lines = [
        f"# heedful bench: {result.model_name} on {result.spec.dataset} ({result.spec.split})",
        "",
        f"- examples: {result.n_examples}" + (f" (skipped: {', '.join(f'{k}: {v}' for k, v in result.skipped.items())})" if result.skipped else ""),
        f"- protocol: `{p.name}` (hash `{p.hash()}`){' — ' + p.citation if p.citation else ''}",
        f"- label watched: {p.label}; output: {p.output}; removal: {p.removal}"
        + (f" (id {p.removal_id})" if p.removal_id is not None else "")
        + ("; re-tokenised" if p.retokenize else ""),
        f"- random baseline: mean ± std over {p.random_seeds} seeds (seed {result.spec.seed} ..)",
    ]
    if result.evidence_source and any(METRICS[n].family == "plausibility" for n in names):
        lines.append(f"- evidence: {result.evidence_source}")
    if any(METRICS[n].family == "context" or n == "precision_at_k" for n in names):
        lines.append(
            f"- context metrics: precision@{p.precision_k}; the target's log-probability with the top k = "
            f"{', '.join(map(str, p.source_ks))} sources removed together, and over {p.lds_ablations} random source "
            f"ablations keeping each source with probability {p.lds_keep:g} (LDS)"
        )
    lines += ["", "## Results", ""]
    header = ["method", *[f"{n} {_arrow(n)}" for n in names], "s / example", "fwd / ex", "bwd / ex", "peak MB"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group, res in result.groups.items():
        cells = [fmt(res.summaries[n].value, res.summaries[n].std if res.seeds > 1 else None) for n in names]
        c = res.cost
        lines.append(
            "| " + " | ".join([group, *cells, fmt(c["seconds"], digits=4), fmt(c["forward"], digits=1),
                               fmt(c["backward"], digits=1), fmt(c["peak_mb"], digits=0)]) + " |"
        )
    lines += interval_lines(result, names)
    for name in [n for n in names if METRICS[n].curve_kind == "sources"]:
        ks = list(p.source_ks)
        lines += ["", f"## {name} per number of removed sources", ""]
        lines += ["| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|" + "---|" * (len(ks) + 1)]
        for group, res in result.groups.items():
            curve = res.summaries[name].curve
            cells = [fmt(v) for v in (curve if curve is not None else [float("nan")] * len(ks))]
            lines.append(f"| {group} | " + " | ".join(cells) + " |")
    curve_names = [n for n in names if METRICS[n].curve_kind == "ratio"]
    for name in curve_names:
        lines += ["", f"## {name} per perturbation ratio", ""]
        xs = [_ratio_label(result, x) for x in result.x]
        lines += ["| method | " + " | ".join(xs) + " |", "|" + "---|" * (len(xs) + 1)]
        for group, res in result.groups.items():
            curve = res.summaries[name].curve
            cells = [fmt(v) for v in (curve if curve is not None else [float("nan")] * len(xs))]
            lines.append(f"| {group} | " + " | ".join(cells) + " |")
    lines += ["", "## Protocol", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in p.describe()]
    return "\n".join(lines) + "\n"


def overlapping(intervals: dict[str, tuple[float, float]]) -> list[str]:
    """``"a / b"`` for every pair of methods whose ``(low, high)`` intervals overlap."""
    keys = [k for k, (lo, hi) in intervals.items() if math.isfinite(lo) and math.isfinite(hi)]
    return [
        f"{a} / {b}"
        for i, a in enumerate(keys)
        for b in keys[i + 1 :]
        if intervals[a][0] <= intervals[b][1] and intervals[b][0] <= intervals[a][1]
    ]


def interval_lines(result: BenchResult, names: list[str]) -> list[str]:
    """Markdown: the metrics aggregated with a 95 % bootstrap interval over examples (the
    context metrics), per method, and which methods' intervals overlap."""
    shown = [n for n in names if any(r.summaries[n].has_interval for r in result.groups.values())]
    if not shown:
        return []
    lines = [
        "", "## 95 % bootstrap intervals over examples", "",
        "Mean over the examples where a metric is defined (n) and its 95 % percentile bootstrap interval "
        "(1000 resamples; the random baseline: per-example means over its seeds).", "",
        "| method | " + " | ".join(f"{n} {_arrow(n)}" for n in shown) + " |", "|" + "---|" * (len(shown) + 1),
    ]
    for group, res in result.groups.items():
        cells = [f"{fmt(res.summaries[n].value)} [{fmt(res.summaries[n].low)}, {fmt(res.summaries[n].high)}] (n={res.summaries[n].n})" for n in shown]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in shown:
        pairs = overlapping({g: (r.summaries[name].low, r.summaries[name].high) for g, r in result.groups.items()})
        lines.append(f"- {name}: intervals that overlap (no difference claimed): {', '.join(pairs) or 'none'}.")
    return lines


def write_csv(result: BenchResult, summary_path: Path, curves_path: Path) -> None:
    names = list(next(iter(result.groups.values())).summaries) if result.groups else []
    with open(summary_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "dataset", "split", "protocol", "method", "seeds", "metric", "value", "std", "n",
                         "higher_is_better", "seconds_per_example", "forward_per_example", "backward_per_example", "peak_mb",
                         "ci_low", "ci_high"])
        for group, res in result.groups.items():
            for name in names:
                s = res.summaries[name]
                writer.writerow([
                    result.model_name, result.spec.dataset, result.spec.split, result.spec.protocol.name, group, res.seeds,
                    name, s.value, s.std, s.n, METRICS[name].higher_is_better,
                    res.cost["seconds"], res.cost["forward"], res.cost["backward"], res.cost["peak_mb"], s.low, s.high,
                ])
    with open(curves_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", "metric", "kind", "x", "value", "std_over_seeds"])
        for group, res in result.groups.items():
            for name in names:
                curve = res.summaries[name].curve
                kind = METRICS[name].curve_kind
                if curve is None or kind is None:
                    continue
                xs = result.x if kind == "ratio" else np.asarray(result.spec.protocol.source_ks) if kind == "sources" else np.arange(1, len(curve) + 1)
                std = res.curve_std.get(name)
                for j, x in enumerate(xs[: len(curve)]):
                    writer.writerow([group, name, kind, x, curve[j], "" if std is None else std[j]])


def plot_curves(result: BenchResult, metric: str, path: Path) -> Path:
    """PNG of ``metric`` against the perturbation ratio, one line per method."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    style = "seaborn-v0_8" if "seaborn-v0_8" in plt.style.available else "ggplot"
    with plt.style.context(style):
        fig, ax = plt.subplots(figsize=(9, 6), facecolor="white")
        x = 100 * result.x if result.spec.protocol.schedule != "count" else result.x
        for k, (group, res) in enumerate(result.groups.items()):
            curve = res.summaries[metric].curve
            if curve is None:
                continue
            color, marker = STYLE.get(group, (f"C{k % 10}", _FALLBACK_MARKERS[k % len(_FALLBACK_MARKERS)]))
            label = DISPLAY.get(group, group)
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=8, linestyle="-", color=color, label=label)
            std = res.curve_std.get(metric)
            if std is not None:
                ax.fill_between(x[: len(curve)], curve - std, curve + std, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("K%" if result.spec.protocol.schedule != "count" else "k tokens", fontsize=14)
        ax.set_ylabel(Y_LABELS.get(metric, metric), fontsize=12, labelpad=8)
        if result.spec.protocol.schedule != "count":
            ax.set_xticks(x)
            ax.set_xticklabels([_ratio_label(result, v) for v in result.x])
        ax.tick_params(axis="both", which="major", labelsize=12, length=6, width=2)
        ax.set_title(
            f"{short_model(result.model_name)} · {Path(result.spec.dataset).name} ({result.spec.split}) · "
            f"protocol {result.spec.protocol.name}",
            fontsize=12,
        )
        ax.legend(facecolor="white", fontsize=12, loc="best")
        fig.savefig(path, format="png", bbox_inches="tight", dpi=100)
        plt.close(fig)
    return path


def write_report(result: BenchResult, out: Path | None = None) -> list[Path]:
    """Markdown, CSV and PNG files of ``result`` in ``out`` (default: the bench's --out)."""
    out = Path(out or result.spec.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = slug(result)
    md, summary_csv, curves_csv = out / f"{stem}.md", out / f"{stem}.csv", out / f"{stem}_curves.csv"
    md.write_text(markdown(result), encoding="utf-8")
    write_csv(result, summary_csv, curves_csv)
    files = [md, summary_csv, curves_csv]
    names = list(next(iter(result.groups.values())).summaries) if result.groups else []
    for name in names:
        if METRICS[name].curve_kind == "ratio" and any(g.summaries[name].curve is not None for g in result.groups.values()):
            files.append(plot_curves(result, name, out / f"{stem}_{name}.png"))
    result.files = files
    return files


def curve_values(result: BenchResult, metric: str) -> dict[str, np.ndarray]:
    """Method -> mean curve of ``metric`` (for scripts and the reproduction report)."""
    return {g: r.summaries[metric].curve for g, r in result.groups.items() if r.summaries[metric].curve is not None}
