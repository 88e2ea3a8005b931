"""Mask-LRP reproduction report (Song et al. 2024, "Better Explain Transformers by Illuminating
Important Information"): the analogue of its Table 1, its AOPC / LOdds curves against the
corruption rate k (Figure 3), the deletion curve, the head map (Figure 5), the random-mask
ablation (Table 1's "Random" row), Table 3 in full (without positional / syntactic heads, AOPC and
LOdds with paired differences) and Figure 6 (one positive sentence, Mask-LRP's word scores minus
each baseline's), on a zoo sentiment model; Eq. 10's E_h read both as the mean over the kept heads
(``mask_lrp``'s default) and over all heads (``heads_mean="all"``); and Table 1 once more on a
deeper classifier with its own head mask (:mod:`~heedful.reproduce.mask_lrp.deep`).

Everything runs through :func:`heedful.evaluate.run_bench` with the ``mask-lrp`` protocol preset
(:mod:`heedful.evaluate.protocol`): gold label, tokens replaced by id 0 in descending score order,
``k = unique(round(linspace(0, 1, 10) * N))[1:]``, examples under 20 tokens skipped. Explanations
and measurements are kept in a results store (default ``heedful_home()/reproduce/mask-lrp``), so a
second run only computes what is missing.

The paper's QA metric, precision@20 on SQuAD (Table 2), has no QA data here; the report
computes it instead on the planted long contexts (:mod:`heedful.datasets.planted`) with a causal
LM, where the answer sentence is known by construction (:func:`_planted_run`).

Report options (``heedful reproduce mask-lrp -O key=value``): ``model`` (zoo name or folder),
``datasets`` (list of names or files), ``split``, ``methods`` (list; default :data:`METHODS`),
``head_mask`` (path of a mask saved by ``heedful heads``; default the model's cached mask),
``mask_seeds`` (random head masks), ``random_seeds`` (seeds of the random-score baseline),
``ig_steps`` (integrated-gradients steps), ``batch_size``. The planted section:
``planted_model`` (default ``smollm2-135m``; ``none`` leaves the section out), ``planted_n``
(documents; default :data:`PLANTED_N`), ``planted_length`` (prompt tokens; default
:data:`PLANTED_LENGTH`), ``planted_methods`` (default: ``methods`` but :data:`PLANTED_SKIPPED`); ``only=planted`` runs that
section alone and writes ``<out>/mask-lrp-planted.md`` (never the full report). ``dataset_n``
(``NAME:N,...``: examples per data set, default ``amazon:500``: every amazon test snippet of at least 20 tokens, 246), ``corruption_seeds``, ``extras``
(data sets that get the corruption curve and the threshold sweep; default the first, ``none``).
The deeper classifier's section: ``deep_model`` (default ``smollm2-sentiment``; ``none`` leaves the
section out; a zoo model that is not built is named in the report, never built by it), ``deep_n``
(examples of the first data set; default :data:`~heedful.reproduce.mask_lrp.run.DEEP_N`, 4 with
``--quick``), ``deep_methods`` (default: those of ``methods`` among
:data:`~heedful.reproduce.mask_lrp.run.DEEP_METHODS`; methods the model cannot run are named with
the reason), ``deep_head_mask`` (a saved mask; default the model's own, selected from the
movie-review train split as the planted model's is).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from heedful.reproduce import ReportSettings
from heedful.reproduce.mask_lrp.claims import _claims_section
from heedful.reproduce.mask_lrp.deep import _deep_run, _deep_section
from heedful.reproduce.mask_lrp.figure6 import _figure6_data, _figure6_title, _plot_figure6
from heedful.reproduce.mask_lrp.markdown import _markdown, _planted_section
from heedful.reproduce.mask_lrp.plots import (
    VARIANT_ROWS,
    _plot_ablation,
    _plot_corruption,
    _plot_curves,
    _plot_deletion,
)
from heedful.reproduce.mask_lrp.run import (
    DEFAULT_N,
    NAME,
    PAPER_ROWS,
    PAPER_TABLE1,
    _conservation,
    _load_mask,
    _plan,
    _planted_run,
    _run_dataset,
)
from heedful.reproduce.mask_lrp.statistics import _concordance, _ranks

__all__ = ["DEFAULT_N", "PAPER_ROWS", "PAPER_TABLE1", "_concordance", "_plan", "_ranks", "write"]


def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run the Mask-LRP experiments and write ``out_dir/mask-lrp.md`` with its ``mask-lrp-*.png`` plots."""
    import heedful
    from heedful.evaluate.protocol import get_protocol
    from heedful.lrp.heads import plot_head_map

    began = time.perf_counter()
    plan = _plan(settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan.store.mkdir(parents=True, exist_ok=True)
    if plan.only == "planted":
        planted = _planted_run(plan)
        path = out_dir / f"{NAME}-planted.md"
        head = [
            "# Mask-LRP reproduction: the planted precision@20 section alone",
            "",
            f"Regenerate with `heedful reproduce mask-lrp -O only=planted{' --quick' if plan.quick else ''}` "
            "(a development run of one section of `mask-lrp.md`"
            + ("; `--quick`: **its numbers are not the report's**" if plan.quick else "") + ").",
            "",
        ]
        path.write_text("\n".join([*head, *_planted_section(plan, planted)]), encoding="utf-8")
        return path
    model = heedful.load(plan.model)
    mask = _load_mask(plan, model)
    shape = (model.adapter.num_layers, model.adapter.config.num_attention_heads)
    if mask.shape != shape:
        from heedful.errors import InputError

        raise InputError(f"the head mask is {mask.shape[0]} x {mask.shape[1]}, the model has {shape[0]} x {shape[1]} heads")
    protocol = dataclasses.replace(get_protocol("mask-lrp"), random_seeds=plan.random_seeds)
    extras = plan.datasets[:1] if plan.extras is None else plan.extras
    runs = [_run_dataset(plan, model, dataset, mask, protocol, first=dataset in extras) for dataset in plan.datasets]
    methods = [m for m in plan.methods if m in runs[0].result.groups]

    files: dict[str, str] = {}
    for run in runs:
        stem = Path(run.dataset).stem
        path = _plot_curves(run, [*methods, *VARIANT_ROWS], out_dir / f"{NAME}-curves-{stem}.png")
        files["curves-" + run.dataset] = path.name
    files["deletion"] = _plot_deletion(runs, [*methods, *VARIANT_ROWS], out_dir / f"{NAME}-deletion.png").name
    files["heads"] = plot_head_map(mask, out_dir / f"{NAME}-heads.png").name
    files["ablation"] = _plot_ablation(runs, out_dir / f"{NAME}-random-masks.png").name
    if "chefer" in runs[0].values and any(k.startswith("mask_lrp (corrupted") for k in runs[0].variants):
        files["corruption"] = _plot_corruption(runs[0], out_dir / f"{NAME}-corruption.png").name
    figure = _figure6_data(plan, runs[0])
    if figure is not None:
        files["figure6"] = _plot_figure6(figure, _figure6_title(figure, runs[0]), out_dir / f"{NAME}-figure6.png").name
    conservation = _conservation(model, plan.datasets[0], plan.split, mask)
    deep = _deep_run(plan, protocol) if plan.deep_model is not None else None
    planted = _planted_run(plan) if plan.planted_model is not None else None
    report = out_dir / f"{NAME}.md"
    report.write_text(
        "\n".join([_markdown(plan, runs, mask, files, time.perf_counter() - began, planted, conservation, deep, figure,
                             _deep_section(plan, deep, mask)),
                   *_claims_section(runs, mask, planted, conservation, deep)]),
        encoding="utf-8",
    )
    return report
