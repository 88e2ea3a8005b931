"""Lecture report, figures: probe accuracy and selectivity per layer with the expected layers,
the causal traces' mean indirect effect per layer at the two sites, and the steering sweep's
success rate against perplexity."""

from __future__ import annotations

from pathlib import Path

from heedful.render.figures import pyplot
from heedful.reproduce.lecture.statistics import SITES, ProbeStats, TraceStats


def plot_probes(stats: dict[tuple[str, str], ProbeStats], path: Path) -> Path:
    """One panel per model: each property's accuracy (solid) and selectivity (dashed) per layer
    with 95 % bands, the expected layer as a vertical line with its interval shaded."""
    plt = pyplot()
    models = list(dict.fromkeys(m for m, _ in stats))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for i, ((_, prop), s) in enumerate((k, v) for k, v in stats.items() if k[0] == model):
            colour = f"C{i}"
            ax.plot(s.layers, s.accuracy[:, 0], "o-", color=colour, label=f"{prop} accuracy", ms=3)
            ax.fill_between(s.layers, s.accuracy[:, 1], s.accuracy[:, 2], color=colour, alpha=0.2)
            ax.plot(s.layers, s.selectivity[:, 0], "--", color=colour, label=f"{prop} selectivity")
            ax.fill_between(s.layers, s.selectivity[:, 1], s.selectivity[:, 2], color=colour, alpha=0.1)
            ax.axvline(s.expected[0], color=colour, lw=1, ls=":")
            ax.axvspan(s.expected[1], s.expected[2], color=colour, alpha=0.12, label=f"{prop} expected layer {s.expected[0]:.2f}")
        ax.set(xlabel="layer (0 = embeddings)", ylabel="test accuracy / selectivity", ylim=(0, 1.02), title=model)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_traces(stats: TraceStats, path: Path) -> Path:
    """Mean indirect effect per layer of restoring each kind's output at the last subject token
    and at the last token (95 % bands over prompts)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(SITES), figsize=(11, 3.6), sharey=True)
    for ax, site in zip(axes, SITES, strict=True):
        for i, kind in enumerate(sorted({k for k, _ in stats.means})):
            rows = stats.means[(kind, site)]
            if not len(rows):
                continue
            layers = range(len(rows))
            ax.plot(layers, rows[:, 0], "o-", ms=3, color=f"C{i}", label=f"{kind} restored")
            ax.fill_between(layers, rows[:, 1], rows[:, 2], color=f"C{i}", alpha=0.2)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set(xlabel="layer (the window's centre block)", title=f"at the {site}")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("indirect effect on p(answer)")
    fig.suptitle(f"causal tracing of factual recall ({stats.prompts} prompts)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(rows: list[dict], path: Path) -> Path:
    """Success rate (Wilson 95 %) against the geometric-mean perplexity (bootstrap 95 %), one
    point per coefficient."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.errorbar(r["perplexity"], r["success"],
                    xerr=[[r["perplexity"] - r["perplexity_low"]], [r["perplexity_high"] - r["perplexity"]]],
                    yerr=[[r["success"] - r["success_low"]], [r["success_high"] - r["success"]]], fmt="o", capsize=3)
        ax.annotate(f"{r['coefficient']:+g}", (r["perplexity"], r["success"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set(xlabel="perplexity of the continuation (unsteered model)", ylabel="share judged POSITIVE", ylim=(-0.02, 1.02),
           title="steering sweep: coefficient of the mean-difference vector")
    ax.set_xscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
