"""Co-perturbation report, plots: the lambda and layer studies over sentences."""

from __future__ import annotations

from pathlib import Path

from heedful.render.figures import pyplot
from heedful.reproduce.toolkit import mean_interval


def _plot_lambda_study(study: dict, path: Path) -> Path:
    plt = pyplot()
    lams = study["lams"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, label in (("measured", "measured (4 draws)"), ("predicted", "first-order prediction")):
        rows = [mean_interval(study[key][:, j]) for j in range(len(lams))]
        axes[0].plot(lams, [r[0] for r in rows], marker="o", label=label)
        axes[0].fill_between(lams, [r[1] for r in rows], [r[2] for r in rows], alpha=0.25)
    axes[0].set(xlabel="lambda (normalised objective)", ylabel="normalised distortion", title="distortion at the linearized noise")
    axes[0].legend()
    rows = [mean_interval(study["spearman_to_ref"][:, j]) for j in range(len(lams))]
    axes[1].plot(lams, [r[0] for r in rows], marker="o", label="Spearman with lambda = 0.6")
    axes[1].fill_between(lams, [r[1] for r in rows], [r[2] for r in rows], alpha=0.25)
    rows = [mean_interval(study["at_ceiling"][:, j]) for j in range(len(lams))]
    axes[1].plot(lams, [r[0] for r in rows], marker="s", label="share of tokens at the ceiling")
    axes[1].fill_between(lams, [r[1] for r in rows], [r[2] for r in rows], alpha=0.25)
    axes[1].set(xlabel="lambda (normalised objective)", ylim=(0, 1.05), title="ranking against lambda")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_layer_study(study: dict, path: Path, optimised: dict | None = None) -> Path:
    """The layer study's concentration and agreement with the head per layer (mean, 95 %
    interval): the linearized solver solid, the optimised one (when given) dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    solvers = [("linearized", study, "-", "o"), *([("optimised", optimised, "--", "s")] if optimised else [])]
    for key, label, colour in (("concentration", "interest on the top 20 % tokens", "C0"), ("spearman_to_head", "Spearman with the head's interest", "C1")):
        for solver, found, style, marker in solvers:
            layers = found["layers"]
            rows = [mean_interval(found[key][:, j]) for j in range(len(layers))]
            ax.plot(layers, [r[0] for r in rows], linestyle=style, marker=marker, color=colour, label=f"{label} ({solver})")
            ax.fill_between(layers, [r[1] for r in rows], [r[2] for r in rows], alpha=0.2, color=colour)
    ax.set(xlabel="layer", ylim=(0, 1.05), xticks=list(study["layers"]), title="layer-wise interest, mean and 95 % interval")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
