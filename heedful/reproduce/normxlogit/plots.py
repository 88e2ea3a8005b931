"""NormXLogit report, plots: the layer x method alignment heatmap and the logit lens per layer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from heedful.reproduce.normxlogit.run import EXP2_METHODS, EXP2_NAMES, LM, Alignment


def plot_alignment(al: Alignment, path: Path) -> Path:
    """Layer x method heatmaps of dot product and average precision (the paper's Figures 4-5)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    labels = [EXP2_NAMES[m] for m in EXP2_METHODS]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.55 * al.layers + 3), 7.5), facecolor="white")
    for ax, values, title in zip(axes, (al.dot, al.ap), ("Dot product ↑", "Average precision ↑"), strict=True):
        im = ax.imshow(values, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
        ax.set_xticks(range(al.layers))
        ax.set_xticklabels([str(i + 1) for i in range(al.layers)], fontsize=8)
        ax.set_xlabel("layer")
        ax.set_title(f"{title} · {LM} · generated agreement pairs (n={al.n})", fontsize=11)
        hi = np.nanmax(values)
        lo = np.nanmin(values)
        for r in range(values.shape[0]):
            for c in range(values.shape[1]):
                v = values[r, c]
                if math.isfinite(v):
                    ax.text(c, r, f"{v:.2f}"[1:] if 0 <= v < 1 else f"{v:.1f}", ha="center", va="center", fontsize=6,
                            color="black" if v > lo + 0.6 * (hi - lo) else "white")
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_lens(al: Alignment, path: Path) -> Path:
    """Per layer: the logit lens's share of pairs preferring the target over the foil, the share
    whose LogAt(target) top is the first token, LogAt(target)'s and random's dot product, and
    KL(final || layer) on a second axis."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    lens = al.lens or {}
    x = np.arange(1, al.layers + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5), facecolor="white")
    ax.plot(x, lens["correct"], marker="o", label="logit lens prefers the target over the foil (share)")
    ax.fill_between(x, lens["correct_low"], lens["correct_high"], alpha=0.2, linewidth=0)
    ax.plot(x, lens["top_first"], marker="s", label="LogAt(target) top at the first token (share)")
    t, r = EXP2_METHODS.index("logat_target"), EXP2_METHODS.index("random")
    ax.plot(x, al.dot[t], marker="^", label="LogAt(target) dot product")
    ax.plot(x, al.dot[r], linestyle="--", color="grey", label="random dot product")
    ax.axhline(0.5, color="black", linewidth=0.5)
    ax.set_xlabel("layer")
    ax.set_ylim(0, 1)
    right = ax.twinx()
    right.plot(x, lens["kl"], color="C3", linestyle=":", marker=".", label="KL(final ‖ layer), nats")
    right.set_ylabel("KL (nats)")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax.set_title(f"Logit lens of {LM} at the anchor, {al.n} agreement pairs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
