"""Mask-LRP report, the paper's Figure 6: Mask-LRP's word scores on one positive test sentence,
and for each baseline the difference, Mask-LRP minus the baseline, coloured green where
Mask-LRP scores a word higher and red where lower."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from heedful.reproduce.mask_lrp.run import NO_POSITIONAL, NO_SYNTACTIC, _DatasetRun, _Plan

SEED = 0
"""Seed of the sentence's choice among the candidates."""
MAX_WORDS = 30
"""Candidates are at most this many words long (the paper's sentence has nine), so one line holds them."""
ROWS: tuple[tuple[str, str], ...] = (
    (NO_POSITIONAL, "Ours w/o M_pos"),
    (NO_SYNTACTIC, "Ours w/o M_synt"),
    ("rollout", "Rollout"),
    ("raw_attention", "RawAtt"),
    ("attcat", "AttCAT"),
    ("lrp", "LRP"),
    ("chefer", "GAE"),
    ("partial_lrp", "PartialLRP"),
    ("cam", "CAM"),
    ("attention_gradcam", "GradCAM"),
)
"""The baselines of Figure 6 in the paper's order (its first seven), then the paper's other
Table 1 baselines: store label -> the paper's name."""


@dataclasses.dataclass
class _Figure6:
    """One sentence: its example id and text, gold label and Mask-LRP's prediction (label,
    probability), whether the model classifies it correctly, how many candidates there were, the
    decoded ``words`` ``[W]``, Mask-LRP's word scores scaled to a largest magnitude of 1 (``ours``
    ``[W]``), and per baseline (the paper's name) Mask-LRP's scaled scores minus the baseline's
    (``rows``: name -> ``[W]``)."""

    example: str
    text: str
    label: str
    predicted: str
    probability: float
    correct: bool
    candidates: int
    words: list[str]
    ours: np.ndarray
    rows: dict[str, np.ndarray]


def _scaled(expl) -> np.ndarray:
    """Word scores (sub-word scores summed, special tokens left out) over their largest magnitude ``[W]``."""
    scores = np.asarray(expl.words("sum").scores, dtype=float)
    top = np.abs(scores).max() if scores.size else 0.0
    return scores / top if top > 0 else scores


def _keys(run: _DatasetRun) -> dict[str, object]:
    """Store keys of the run's explanations: each method's (its first seed) and each single-mask variant's."""
    keys = {r.group: r.key for r in run.result.runs if r.group not in ("random",)}
    keys.update({label: v.keys[0] for label, v in run.variants.items() if len(v.keys) == 1})
    return keys


def _figure6_data(plan: _Plan, run: _DatasetRun) -> _Figure6 | None:
    """Figure 6's sentence, chosen with :data:`SEED` among the run's examples whose gold label is
    the positive one, of at most :data:`MAX_WORDS` words, that the model classifies correctly (all
    gold-positive ones of that length when it gets none right); None when the data have no
    positive label or no such example."""
    from heedful.evaluate.store import ResultsStore

    keys = _keys(run)
    with ResultsStore(plan.store) as store:
        ours = store.get_explanations(keys["mask_lrp"], run.ids)
        positive = [i for i in run.ids if i in ours and ours[i].target.label.upper().startswith("POS")
                    and len(ours[i].words().words) <= MAX_WORDS]
        right = [i for i in positive if ours[i].prediction.get("label") == ours[i].target.label]
        candidates = right or positive
        if not candidates:
            return None
        chosen = candidates[int(np.random.default_rng(SEED).integers(len(candidates)))]
        mine = ours[chosen]
        base = _scaled(mine)
        rows = {}
        for label, name in ROWS:
            if label in keys:
                other = store.get_explanations(keys[label], [chosen]).get(chosen)
                if other is not None:
                    rows[name] = base - _scaled(other)
    return _Figure6(
        chosen, mine.text, mine.target.label, str(mine.prediction.get("label", "?")), float(mine.prediction.get("probability", float("nan"))),
        bool(right), len(candidates), list(mine.words().words), base, rows,
    )


def _plot_figure6(found: _Figure6, title: str, path: Path) -> Path:
    """Figure 6: the first row shades each word by Mask-LRP's scaled score (darker is higher);
    each further row colours it by Mask-LRP minus the baseline (green: Mask-LRP higher, red:
    lower; darker: a larger difference, one scale for all rows)."""
    import matplotlib

    from heedful.render.figures import pyplot

    plt = pyplot()  # before matplotlib's colormaps: the Agg backend first
    widths = [len(w) for w in found.words]
    starts = np.concatenate([[0], np.cumsum([w + 1 for w in widths])[:-1]])
    span = int(starts[-1] + widths[-1]) if widths else 1
    margin = max(len(n) for n in ["Ours (Mask-LRP)", *(f"Δ {r}" for r in found.rows)]) + 2
    rows = 1 + len(found.rows)
    width = max(0.1 * (span + margin) + 0.6, 0.075 * len(title) + 1.0)  # a monospace character is about 0.083 in
    fig, ax = plt.subplots(figsize=(width, 0.42 * rows + 1.0), facecolor="white")
    biggest = max([float(np.abs(d).max()) for d in found.rows.values()] + [1e-12])
    greens, reds, blues = (matplotlib.colormaps[n] for n in ("Greens", "Reds", "Blues"))
    deepest = 0.65  # the darkest shade used: black words stay readable on it

    def line(y: float, name: str, colours: list) -> None:
        ax.text(-margin, y, name, ha="left", va="center", family="monospace", fontsize=10, parse_math=False)
        for word, x, colour in zip(found.words, starts, colours, strict=True):
            ax.text(x, y, word, ha="left", va="center", family="monospace", fontsize=10, parse_math=False,
                    bbox={"boxstyle": "square,pad=0.2", "facecolor": colour, "edgecolor": "none"})

    line(0, "Ours (Mask-LRP)", [blues(deepest * max(float(v), 0.0)) for v in found.ours])
    for k, (name, diff) in enumerate(found.rows.items(), start=1):
        line(-k, f"Δ {name}", [(greens if d > 0 else reds)(deepest * abs(float(d)) / biggest) if d else "white" for d in diff])
    ax.set_xlim(-margin - 0.5, span + 0.5)
    ax.set_ylim(-rows + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title, fontsize=10, loc="left", parse_math=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _figure6_section(found: _Figure6 | None, run: _DatasetRun, image: str | None) -> list[str]:
    """Markdown of Figure 6: how the sentence was chosen, the figure, and the words each baseline
    scores lower or higher than Mask-LRP by the most."""
    lines = ["## One sentence, Mask-LRP against each baseline (paper Figure 6)", ""]
    if found is None or image is None:
        return lines + [f"Not drawn: no {run.dataset} example of this run has a positive gold label and at most "
                        f"{MAX_WORDS} words.", ""]
    chosen = "classified correctly" if found.correct else "whether classified correctly or not (the model gets none of them right)"
    lines += [
        f"The paper draws one positive SST-2 sentence (\"it's a charming and often affecting journey.\"). Here: example "
        f"`{found.example}` of the {run.dataset} test examples of this run, drawn with seed {SEED} from the "
        f"{found.candidates} with gold label {found.label}, at most {MAX_WORDS} words, {chosen} "
        f"(`numpy.random.default_rng({SEED}).integers({found.candidates})` over them in the run's order); the model "
        f"predicts {found.predicted} (p = {found.probability:.3f}). Scores are per word (sub-word scores summed, "
        "special tokens left out), each method's divided by its largest magnitude on this sentence so that the rows "
        "share a scale; the first row is Mask-LRP's (Eq. 10 as written; darker = higher), each further row Mask-LRP's "
        "minus the baseline's (green: Mask-LRP higher, red: lower; one colour scale for all rows).",
        "",
        f"![Figure 6: Mask-LRP against each baseline on one sentence]({image})",
        "",
        "| baseline | words Mask-LRP scores higher (difference) | words it scores lower |",
        "|---|---|---|",
    ]
    words = [w.replace("|", "\\|") for w in found.words]
    for name, diff in found.rows.items():
        order = np.argsort(-diff, kind="stable")
        high = [f"{words[i]} ({diff[i]:+.2f})" for i in order[:3] if diff[i] > 0]
        low = [f"{words[i]} ({diff[i]:+.2f})" for i in order[::-1][:3] if diff[i] < 0]
        lines.append(f"| {name} | {', '.join(high) or '–'} | {', '.join(low) or '–'} |")
    return [*lines, ""]


def _figure6_title(found: _Figure6, run: _DatasetRun) -> str:
    return (f"{run.result.model_name.rsplit('@', 1)[0]} · {run.dataset} example {found.example} · gold {found.label}, "
            f"predicted {found.predicted} (p={found.probability:.2f})")

