"""Mask-LRP report, plots: the AOPC / LOdds curves against k, the deletion curve, the random-mask
ablation and the corruption curve."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce.mask_lrp.run import (
    ALL_HEADS,
    PAPER_ROWS,
    RANDOM_MASK,
    RANDOM_REFERENCE,
    REFERENCE,
    _DatasetRun,
)
from heedful.reproduce.mask_lrp.statistics import _corruption_points, _curve, _interval, _ours


# ---------------------------------------------------------------------------- plots
def _style(method: str, k: int) -> tuple[Any, str, str]:
    """Colour, marker and line style of a method in the plots (distinct colours, by position)."""
    import matplotlib

    fixed = {
        "mask_lrp": ("red", "o", "-"),
        REFERENCE: ("#8b0000", "o", "--"),
        RANDOM_MASK: ("#333333", "s", "--"),
        RANDOM_REFERENCE: ("#777777", "s", ":"),
        ALL_HEADS: ("#ff7f0e", "o", "-."),
        "random": ("#999999", "x", ":"),
    }
    if method in fixed:
        return fixed[method]
    markers = "v^<>DPX*hp8d"
    palette = (0, 2, 4, 8, 10, 12, 14, 16, 18, 1, 3, 5, 9, 11, 13, 15, 17, 19)  # tab20 without the reds
    return matplotlib.colormaps["tab20"](palette[k % len(palette)]), markers[k % len(markers)], "-"


SEEDED = (RANDOM_MASK, RANDOM_REFERENCE)
"""Rows that are means over random head masks (their plots show +- one std over seeds)."""
VARIANT_ROWS = (ALL_HEADS, REFERENCE, RANDOM_MASK, RANDOM_REFERENCE)
"""The Mask-LRP variants shown beside the methods in every table and plot."""
VARIANT_NAMES = {
    "mask_lrp": "Ours (Mask-LRP, Eq. 10 as written)",
    ALL_HEADS: "Ours, E_h over all heads",
    REFERENCE: "Ours, the authors' code",
    RANDOM_MASK: "Random mask (Eq. 10 as written)",
    RANDOM_REFERENCE: "Random mask, the authors' code",
}


def _label(method: str) -> str:
    if method in VARIANT_NAMES:
        return f"{VARIANT_NAMES[method]} [{method}]"
    return f"{PAPER_ROWS[method]} [{method}]" if method in PAPER_ROWS else method


def _plot_curves(run: _DatasetRun, methods: list[str], path: Path) -> Path:
    """AOPC and LOdds against k, one line per method (random-mask band: +- one std over seeds)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    x = 100 * np.asarray(run.result.x, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("AOPC (higher is better)", "LOdds (lower is better)"), strict=True):
        for k, method in enumerate(methods):
            curve, std = _curve(run, method, metric)
            if curve is None:
                continue
            color, marker, line = _style(method, k)
            width = 2.6 if method in ("mask_lrp", REFERENCE, ALL_HEADS) else 1.4
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=5, linestyle=line, linewidth=width, color=color, label=_label(method))
            if std is not None and method in SEEDED:
                ax.fill_between(x[: len(curve)], curve - std, curve + std, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("k (% of tokens removed, specials counted)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:.0f}" for v in x])
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{run.result.model_name.rsplit('@', 1)[0]} · {run.dataset} ({run.result.spec.split}, n={run.result.n_examples}) · protocol mask-lrp")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_deletion(runs: list[_DatasetRun], methods: list[str], path: Path) -> Path:
    """Mean gold-label probability as the top-k tokens are replaced (k = 0 is the intact input)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, len(runs), figsize=(7.5 * len(runs), 5.5), facecolor="white", squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        x = np.concatenate([[0.0], 100 * np.asarray(run.result.x, dtype=float)])
        for k, method in enumerate(methods):
            deletion, std = _curve(run, method, "deletion")
            aopc, _ = _curve(run, method, "aopc")
            if deletion is None or aopc is None:
                continue
            start = float(deletion[0] + aopc[0])  # p(gold | intact input), the same for every method
            curve = np.concatenate([[start], deletion])
            color, marker, line = _style(method, k)
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=4, linestyle=line,
                    linewidth=2.6 if method in ("mask_lrp", REFERENCE) else 1.3, color=color, label=_label(method))
            if std is not None and method in SEEDED:
                ax.fill_between(x[1 : len(curve)], deletion - std, deletion + std, color=color, alpha=0.2, linewidth=0)
        ax.set_title(f"{run.dataset} (n={run.result.n_examples})")
        ax.set_xlabel("k (% of tokens replaced by [PAD])")
        ax.set_ylabel("mean p(gold label)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("Deletion curves (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_ablation(runs: list[_DatasetRun], path: Path) -> Path:
    """Mean AOPC and LOdds of each random head mask (points, one per seed) against the selected
    mask (solid line) and all heads (``chefer``, dotted), per data set and variant, with the
    selected mask's 95 % bootstrap interval (shaded)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    cases = [(run, real, rand) for run in runs for real, rand in (("mask_lrp", RANDOM_MASK), (REFERENCE, RANDOM_REFERENCE))]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("mean AOPC (higher is better)", "mean LOdds (lower is better)"), strict=True):
        for i, (run, real, rand) in enumerate(cases):
            vals = run.variants[rand].seed_means[metric]
            jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
            ax.scatter(i + jitter, vals, color="#555555", s=28, zorder=3, label="random masks (one per seed)" if i == 0 else None)
            mean, low, high = _interval(run, real, metric)
            ax.fill_between([i - 0.3, i + 0.3], low, high, color="red", alpha=0.15, linewidth=0,
                            label="selected mask, 95% bootstrap interval" if i == 0 else None)
            ax.hlines(mean, i - 0.3, i + 0.3, color="red", linewidth=2.5, label="selected mask" if i == 0 else None)
            full, _ = _ours(run, "chefer", metric)
            if math.isfinite(full):
                ax.hlines(full, i - 0.3, i + 0.3, color="#1f77b4", linestyle=":", linewidth=2, label="all heads (chefer)" if i == 0 else None)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{run.dataset}\n{'Eq. 10' if real == 'mask_lrp' else 'authors code'}" for run, real, _ in cases])
        ax.set_xlim(-0.6, len(cases) - 0.4)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("Mask-LRP: selected head mask vs random masks of the same size")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_corruption(run: _DatasetRun, path: Path) -> Path:
    """Figure 4: AOPC and LOdds against the corruption rate with 95 % bootstrap bands."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("mean AOPC (higher is better)", "mean LOdds (lower is better)"), strict=True):
        points = _corruption_points(run, metric)
        x = np.array([100 * r for r, _ in points])
        mean, low, high = (np.array([p[1][i] for p in points]) for i in range(3))
        ax.fill_between(x, low, high, color="#1f77b4", alpha=0.25, linewidth=0, label="95% bootstrap interval over examples")
        ax.plot(x, mean, color="#1f77b4", marker="o", linewidth=2, label="Mask-LRP (Eq. 10 as written), corrupted mask")
        ref = _interval(run, REFERENCE, metric)
        ax.axhline(ref[0], color="#8b0000", linestyle="--", linewidth=1.2, label="selected mask, the authors' code")
        ax.set_xlabel("corruption rate: % of the unselected heads switched on")
        ax.set_ylabel(ylabel)
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"Mask-LRP against mask corruption (paper Figure 4; 100% = all heads = chefer) · {run.dataset} (n={run.result.n_examples})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
