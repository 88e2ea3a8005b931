"""Figures for the interest studies (matplotlib, written to a file; no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heedful.interest.studies import LambdaSweep, LayerMap
from heedful.render.figures import pyplot


def plot_layer_map(result: LayerMap, out: str | Path, show_special: bool = True) -> Path:
    """Layer x token heatmap of interest (the paper's Figure 5): one row per layer, one column
    per token, colour = normalised ``rho`` within the layer."""
    plt = pyplot()
    cols = [i for i, sp in enumerate(result.special) if show_special or not sp]
    data = result.scores[:, cols]
    labels = [result.tokens[i] for i in cols]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(cols) + 2), max(2.5, 0.4 * len(result.layers) + 1.5)))
    image = ax.imshow(data, aspect="auto", cmap="YlOrRd")
    ax.set_xticks(range(len(cols)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(result.layers)), [f"layer {k}" for k in result.layers])
    ax.set_title(f"co-perturbation interest by layer (target: {result.target})")
    fig.colorbar(image, ax=ax, label="interest (normalised 1/sigma)")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_lambda_sweep(result: LambdaSweep, out: str | Path, mark: float | None = 0.6) -> Path:
    """Two panels (the paper's Figure 4): (a) interest of the chosen words against lambda;
    (b) the distortion (MLE) term at the estimated noise against lambda."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    lams = np.asarray(result.lams)
    for w, word in enumerate(result.words):
        left.plot(lams, result.interest[:, w], marker="o", label=word)
    left.set_xlabel("lambda")
    left.set_ylabel("interest (normalised 1/sigma)")
    left.set_title("(a) interest of chosen words")
    left.legend()
    right.plot(lams, result.distortion, marker="o", color="black")
    right.set_xlabel("lambda")
    right.set_ylabel("relative distortion E||phi(x) - phi(x~)||^2 / ||phi(x)||^2", fontsize=8)
    right.set_title("(b) distortion at the estimated noise")
    if mark is not None:
        for ax in (left, right):
            ax.axvline(mark, color="grey", linestyle=":", linewidth=1)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
