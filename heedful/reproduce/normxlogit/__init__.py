"""``heedful reproduce normxlogit``: the NormXLogit paper's two experiments on the zoo models.

Abbasi et al., *NormXLogit: The Head-on-Top Never Lies* (specs/methods.md §2.1).

* **Experiment 1 (faithfulness).** AOPC and accuracy of the perturbed predictions over the
  perturbation ratios of the ``normxlogit`` protocol preset (``[MASK]`` for encoders, deletion for
  decoders; predicted label; means over 10 .. 90 %) for the random baseline (mean ± std over
  seeds), gradient norm, gradient × input, integrated gradients, the input-embedding norm, LogAt
  and NormXLogit, with signed gradient × input / integrated gradients and (regression) Eq. 8's printed
  sign as extra rows -- on ``minilm-sentiment`` and ``smollm2-sentiment`` (when built) with the movie
  snippets, and the Pearson correlation (and its drop) of ``minilm-sentiment-regression``. Run
  through :func:`heedful.evaluate.bench.run_bench`, so explanations and perturbation curves are
  stored and a rerun computes only what is missing. The paper's BERT / Llama-2 numbers (SST-2,
  STS-B; Tables 1 and 3) sit beside ours, with how far the method orderings agree.
* **Experiment 2 analogue (evidence alignment per layer).** On agreement minimal pairs generated
  by :mod:`heedful.datasets.agreement` (not BLiMP) with ``smollm2-135m`` predicting the target
  word as the next token: dot product and average precision of LogAt(target), LogAt(foil),
  NormXLogit (layer-wise, logit lens) and of the embedding norm and the random baseline against
  the known evidence words, as a layer x method heatmap (the paper's Figures 4-5), beside the logit
  lens's quality per layer (target vs foil, KL to the final distribution, target rank). One
  forward pass per batch of pairs serves every method and every layer. The alignment is also
  read with the anchor position (the last prefix token, which in two paradigms is the evidence
  word itself) taken out of scores and evidence, per paradigm with intervals; the claim that
  NormXLogit is ahead of GlobEnc¬, ALTI¬ and Value Zeroing¬ at almost all layers is tested on
  that reading, paired per layer.
* **Claims.** Every claim of the paper with this run's number and a verdict.

Report options (``--option key=value``): ``ig_steps`` (encoders, default 20), ``ig_steps_decoder``
(default 8), ``n_decoder`` (examples for the decoder classifier, default ``min(n, 200)``; 0 leaves
the decoder out -- a SmolLM2 forward pass costs about ten times MiniLM's), ``n_regression``
(default 200), ``n_agreement`` (pairs, default 500), ``random_seeds`` (seeds of the random
baseline in Experiment 1, default 2), ``batch_size`` (default 16).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from heedful.reproduce import ReportSettings
from heedful.reproduce.normxlogit.claims import claims_section
from heedful.reproduce.normxlogit.markdown import (
    adjacent_overlaps,
    alignment_section,
    anchor_section,
    below_random,
    case_section,
    experiments_section,
    lens_section,
    ordering_chain,
    timing_section,
)
from heedful.reproduce.normxlogit.plots import plot_alignment, plot_lens
from heedful.reproduce.normxlogit.run import (
    BERT,
    CASES,
    DECODER_CLASSIFIER,
    DEFAULT_IG_STEPS,
    DEFAULT_IG_STEPS_DECODER,
    DEFAULT_N,
    DEFAULT_N_AGREEMENT,
    DEFAULT_N_DECODER,
    DEFAULT_N_REGRESSION,
    DEFAULT_RANDOM_SEEDS,
    EXP2_METHODS,
    LLAMA,
    LM,
    METHODS,
    PAPER,
    PAPER_SST2_ACCURACY,
    PAPER_SST2_AOPC,
    PAPER_STSB_PEARSON,
    QUICK_IG_STEPS,
    QUICK_N,
    QUICK_N_AGREEMENT,
    RANDOM_SEEDS_EXP2,
    TIMING_MODEL,
    Alignment,
    Timing,
    _load_alignment,
    _model_available,
    _save_alignment,
    alignment_scores,
    alignment_values,
    gradient_aggregation,
    lens_quality,
    run_alignment,
    run_case,
    run_timing,
    store_dir,
    summarise_alignment,
    without_position,
)
from heedful.reproduce.normxlogit.statistics import (
    LENS_ROWS,
    leader,
    lens_summary,
    ordering,
    pair_agreement,
    verdict,
)
from heedful.reproduce.toolkit import count_option
from heedful.reproduce.toolkit import (
    count_verdict as _layers_verdict,  # the names the report's tests use
)
from heedful.reproduce.toolkit import summary_verdict as _cmp_verdict

__all__ = ["Alignment", "BERT", "DECODER_CLASSIFIER", "EXP2_METHODS", "LENS_ROWS", "LLAMA", "LM", "METHODS", "PAPER_SST2_ACCURACY", "PAPER_SST2_AOPC", "PAPER_STSB_PEARSON", "RANDOM_SEEDS_EXP2", "_cmp_verdict", "_layers_verdict", "_load_alignment", "_save_alignment", "adjacent_overlaps", "alignment_scores", "alignment_section", "alignment_values", "anchor_section", "below_random", "leader", "lens_quality", "lens_section", "lens_summary", "ordering", "ordering_chain", "pair_agreement", "plot_alignment", "plot_lens", "summarise_alignment", "verdict", "without_position", "write"]


def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run both experiments and write ``out_dir/normxlogit.md`` with its PNG plots (see the module
    docstring). In quick mode the report is ``normxlogit-quick.md``, so a smoke run never
    overwrites the real one."""
    import torch

    from heedful import zoo

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    quick = settings.quick
    n = settings.n or (QUICK_N if quick else DEFAULT_N)
    ig_steps = count_option(settings.options, "ig_steps", QUICK_IG_STEPS if quick else DEFAULT_IG_STEPS)
    ig_steps_decoder = count_option(settings.options, "ig_steps_decoder", QUICK_IG_STEPS if quick else DEFAULT_IG_STEPS_DECODER)
    n_decoder = count_option(settings.options, "n_decoder", min(n, DEFAULT_N_DECODER), minimum=0)
    n_agreement = count_option(settings.options, "n_agreement", QUICK_N_AGREEMENT if quick else DEFAULT_N_AGREEMENT, minimum=0)
    n_regression = count_option(settings.options, "n_regression", min(n, DEFAULT_N_REGRESSION), minimum=0)
    random_seeds = count_option(settings.options, "random_seeds", DEFAULT_RANDOM_SEEDS)
    batch_size = count_option(settings.options, "batch_size", 16)
    aggregate = gradient_aggregation()
    began = time.perf_counter()

    lines = [
        "# NormXLogit reproduction",
        "",
        f"{PAPER} (specs/methods.md §2): faithfulness of NormXLogit, LogAt and gradient methods (Experiment 1) "
        "and layer-wise alignment with known evidence (Experiment 2), re-run on heedful's zoo models.",
        "",
        f"Regenerate with `heedful reproduce normxlogit{' --quick' if quick else ''}"
        + (f" --n {settings.n}" if settings.n else "")
        + "".join(f" -O {k}={v}" for k, v in sorted(settings.options.items()))
        + "` "
        f"(results store: `{store_dir(settings)}`; a rerun reuses stored explanations). "
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
    ]
    if quick:
        lines += ["> **Quick smoke run**: a handful of examples and few IG steps; the numbers are not the report's.", ""]
    lines += [
        "**What differs from the paper.** Our models are small (MiniLM-L6 fine-tuned on movie snippets in place of "
        "BERT-base / DeBERTa on SST-2; a SmolLM2-135M classifier in place of Llama-2-7B with LoRA; MiniLM regression "
        "on snippet ratings in place of STS-B). The data are the VADER movie-review snippets, not SST-2 / STS-B, so "
        "only the *ordering* of methods is comparable with the paper, not the numbers. DecompX runs with the "
        "reference's defaults (biases shared by `absdot`, feed-forward blocks and the classification head included; "
        "for regression, as the paper, the norm of the final layer's decomposed vectors); the paper has no DecompX "
        "number for Llama 2 (it calls DecompX BERT-specific), heedful's decomposes the SmolLM2 classifier too. Value "
        "Zeroing (rolled out) is the paper's appendix A.2 Figure 6 baseline, which it shows only as a curve. "
        f"Integrated gradients uses {ig_steps} steps on MiniLM and {ig_steps_decoder} on "
        f"SmolLM2 (the paper: 50 for BERT, 25 for Llama 2). Examples: {n} (sentiment classifiers; "
        f"{n_decoder} for the decoder), {n_regression} (regression), {n_agreement} agreement pairs; the random "
        f"baseline runs with {random_seeds} seeds. These sizes fit a shared two-core CPU in about two hours; "
        "`--n 500 --option n_regression=500` (and more `random_seeds`) give larger samples, reusing what is stored.",
        "",
        "## Experiment 1: faithfulness",
        "",
        "AOPC is the mean drop of the predicted class's probability when the top K % of tokens (special tokens "
        "counted, [CLS] never removed) are removed, averaged over K = 10..90 % (higher is better); accuracy is that of "
        "the perturbed predictions against the gold labels (lower is better); for regression the Pearson correlation "
        "of the perturbed outputs with the gold ratings (lower is better) and its drop from the unperturbed "
        "correlation (higher is better).",
        "",
    ]
    timings: list[tuple[str, float]] = []
    explaining: dict[str, float] = {}
    results: dict[str, Any] = {}
    al: Alignment | None = None
    timing: Timing | None = None
    for case in CASES:
        lines += [f"### {case.key}" + (" (decoder)" if case.decoder else ""), ""]
        ok, why = _model_available(case.model)
        later = "once it is built"
        if ok and case.decoder and n_decoder < 1:
            ok, why, later = False, (
                "the model is built but was left out of this run (`--option n_decoder=0`) to fit its time budget: "
                "every example costs about 10 removal ratios × 8 method runs forward passes plus integrated "
                "gradients' passes, at roughly ten times MiniLM's cost per pass"
            ), "without that option"
        if not ok:
            lines += [f"**Not run**: {why}. Rerun `heedful reproduce normxlogit` {later} to fill this "
                      f"section (compared with the paper's {case.column_name} column).", ""]
            timings.append((case.key, float("nan")))
            continue
        steps = ig_steps_decoder if case.decoder else ig_steps
        count = n_decoder if case.decoder else (n_regression if "pearson" in case.metrics else n)
        result, wall, plots = run_case(case, settings, out_dir, count, steps, aggregate, batch_size, random_seeds)
        timings.append((case.key, wall))
        results[case.key] = result
        explaining[case.key] = sum(
            g.cost["seconds"] * g.seeds for g in result.groups.values() if math.isfinite(g.cost["seconds"])
        ) * result.n_examples
        lines += case_section(case, result, wall, plots, steps, aggregate)

    lines += ["## Experiment 2 analogue: layer-wise evidence alignment", ""]
    ok, why = _model_available(LM)
    if not ok:
        lines += [f"**Not run**: {why}.", ""]
        timings.append(("alignment", float("nan")))
    else:
        start = time.perf_counter()
        al = run_alignment(settings, n_agreement, batch_size)
        stem = "normxlogit-quick-" if quick else "normxlogit-"
        plot = plot_alignment(al, out_dir / f"{stem}alignment.png")
        timings.append(("alignment", time.perf_counter() - start))
        lines += alignment_section(al, plot) + anchor_section(al)
        if al.lens is not None:
            lines += lens_section(al, plot_lens(al, out_dir / f"{stem}logit-lens.png"))

    lines += ["## Cost: the paper's Tables 4-5 on our models", ""]
    start = time.perf_counter()
    ok, why = _model_available(TIMING_MODEL)
    if ok:
        timing = run_timing(ig_steps, quick)
        lines += timing_section(timing)
    else:
        lines += [f"**Not run**: {why}.", ""]
    timings.append(("cost", time.perf_counter() - start if ok else float("nan")))
    lines += experiments_section()

    total = time.perf_counter() - began
    lines += ["## Run", "", "| section | wall time of this run | explaining, when first computed |", "|---|---|---|"]
    for k, v in timings:
        first = explaining.get(k)
        first_text = f"{first / 60:.1f} min" if first is not None else ("–" if k != "alignment" or not math.isfinite(v) else "")
        if k == "alignment" and math.isfinite(v):
            first_text = f"{al.seconds / 60:.1f} min (all of it)"
        lines.append(f"| {k} | {'not run' if not math.isfinite(v) else f'{v / 60:.1f} min'} | {first_text} |")
    lines += [f"| total | {total / 60:.1f} min | |", "",
              f"Zoo models: {', '.join(f'`{m}`' for m in zoo.ENTRIES)}. Wall times on a shared CPU ({torch.get_num_threads()} torch thread(s)); "
              "a rerun reuses the stored explanations and perturbation measurements. The last column sums the stored "
              "cost of explaining (perturbing and re-scoring for the metrics comes on top).", ""]
    lines += claims_section(results, al, timing)
    path = out_dir / ("normxlogit-quick.md" if quick else "normxlogit.md")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
