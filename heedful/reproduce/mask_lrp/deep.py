"""Mask-LRP report, the deeper classifier: the Table 1 analogue on a second, deeper model
(default ``smollm2-sentiment``, 30 blocks x 9 heads) with its own head mask, selected the same
way and from the same train split as the planted section's (:func:`~heedful.reproduce.mask_lrp.run._model_mask`), on the report's
first data set, through the same runs as the main model (:func:`~heedful.reproduce.mask_lrp.run._run_dataset`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce.mask_lrp.run import _DatasetRun, _model_mask, _Plan, _run_dataset


@dataclasses.dataclass
class _DeepRun:
    """The deeper classifier's run: its name, the data set's run (None when it could not run, with
    ``missing`` saying why), its head ``mask``, the methods left out with the reason
    (``skipped``: method -> what the model lacks), and the wall seconds (head mask included)."""

    model: str
    run: _DatasetRun | None
    mask: Any = None
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    missing: str = ""
    seconds: float = 0.0


def unavailable(name: str) -> str:
    """Why model ``name`` cannot be loaded without building it ('' when it can): a zoo entry that
    is not built (building it takes the better part of an hour); a folder or another name is left
    to :func:`heedful.load`."""
    from heedful import zoo

    if name in zoo.ENTRIES and not zoo.is_built(name):
        return f"`{name}` is not built on this machine (`heedful models build {name}` builds it)"
    return ""


def supported(methods: list[str], adapter) -> tuple[list[str], dict[str, str]]:
    """``methods`` split into those that run on ``adapter``'s model and the others, each with what
    it lacks (the method's task list or its needs, :meth:`~heedful.registry.MethodInfo.missing`)."""
    from heedful.attribution import get_method

    runs, skipped = [], {}
    for name in methods:
        info = get_method(name)
        gone = info.missing(adapter)
        if not info.supports(adapter.task):
            skipped[name] = f"no {adapter.task} task"
        elif gone:
            skipped[name] = "needs " + ", ".join(gone)
        else:
            runs.append(name)
    return runs, skipped


def _deep_run(plan: _Plan, protocol) -> _DeepRun:
    """Every run of the main model's first data set, on ``plan.deep_model`` with its own mask and
    ``plan.deep_n`` examples (no corruption curve or threshold sweep)."""
    import heedful
    from heedful.errors import InputError

    began = time.perf_counter()
    name = str(plan.deep_model)
    missing = unavailable(name)
    if missing:
        return _DeepRun(name, None, missing=missing)
    model = heedful.load(name, progress=plan.progress)
    shown = Path(name).name
    if model.task != "classification":
        return _DeepRun(shown, None, missing=f"`{shown}` is a {model.task} model, not a classifier")
    methods, skipped = supported(plan.deep_methods, model.adapter)
    if "mask_lrp" not in methods:
        return _DeepRun(shown, None, skipped=skipped, missing=f"`mask_lrp` does not run on `{shown}` ({skipped.get('mask_lrp')})")
    mask = _model_mask(model.adapter, plan.quick, plan.deep_head_mask)
    shape = (model.adapter.num_layers, model.adapter.config.num_attention_heads)
    if mask.shape != shape:
        raise InputError(f"the deep head mask is {mask.shape[0]} x {mask.shape[1]}, `{shown}` has {shape[0]} x {shape[1]} heads")
    deep = dataclasses.replace(plan, methods=methods, n=plan.deep_n, dataset_n={})
    run = _run_dataset(deep, model, plan.datasets[0], mask, protocol, first=False)
    run.model = shown
    return _DeepRun(shown, run, mask, skipped, seconds=time.perf_counter() - began)


def _block_table(mask) -> list[str]:
    """Markdown: the kept heads of every block that keeps one (kept, syntactic, positional), and the blocks keeping none."""
    lines = ["| block | heads kept | syntactic | positional | heads |", "|---|---|---|---|---|"]
    for layer in range(mask.shape[0]):
        kept = [int(h) for h in np.nonzero(mask.mask[layer])[0]]
        if kept:
            lines.append(f"| {layer} | {len(kept)} | {int(mask.syntactic[layer].any(-1).sum())} | {int(mask.positional[layer].sum())} | "
                         f"{', '.join(map(str, kept))} |")
    empty = [str(layer) for layer in range(mask.shape[0]) if not mask.mask[layer].any()]
    return [*lines, "", f"Blocks keeping no head ({len(empty)} of {mask.shape[0]}): {', '.join(empty) or 'none'}.", ""]


def _deep_section(plan: _Plan, deep: _DeepRun | None, main_mask) -> list[str]:
    """Markdown of the deeper classifier's Table 1: why it is run, its head mask per block, the
    methods left out and why, the table with the paper's column, and what the orderings say."""
    from heedful.reproduce.mask_lrp.markdown import _dataset_table, _ordering_notes

    if deep is None:
        return []
    lines = [f"## Table 1 on a deeper classifier: `{deep.model}`", ""]
    kept, total = int(main_mask.mask.sum()), main_mask.mask.size
    empty = sum(1 for layer in range(main_mask.shape[0]) if not main_mask.mask[layer].any())
    lines.append(
        f"On the main model the selected mask keeps {kept} of {total} heads and {empty} of {main_mask.shape[0]} blocks keep "
        "none. The same analogue on a deeper "
        f"classifier: `{deep.model}`, its own head mask selected the same way (Eq. 6-8, xi_synt 0.1, xi_pos 0.8) from the "
        "same movie-review train split" + (" (its first 1,000 texts in this quick run)" if plan.quick and not plan.deep_head_mask else "")
        + (f" (here read from `{plan.deep_head_mask}`)" if plan.deep_head_mask else "")
        + f", the same protocol and the same data set ({plan.datasets[0]}), explained where the classifier reads (a "
        "decoder's last token)."
    )
    lines.append("")
    if deep.run is None:
        return lines + [f"**Not run here:** {deep.missing}.", ""]
    mask, run = deep.mask, deep.run
    layers, heads = mask.shape
    lines += [
        f"- model: `{run.result.model_name.rsplit('@', 1)[0]}` ({layers} blocks x {heads} heads); **kept {int(mask.mask.sum())} of "
        f"{mask.mask.size} heads ({mask.rate:.1%} mask rate)**: {int(mask.syntactic.any(-1).sum())} syntactic, "
        f"{int(mask.positional.sum())} positional",
        f"- methods: {', '.join(f'`{m}`' for m in run.result.groups)}"
        + ("; not run: " + "; ".join(f"`{m}` ({why})" for m, why in deep.skipped.items()) if deep.skipped else
           "; every method asked for supports a decoder classifier")
        + ("; not asked for, to keep the run time down (`-O deep_methods=...` adds them): "
           + ", ".join(f"`{m}`" for m in plan.methods if m not in plan.deep_methods)
           if any(m not in plan.deep_methods for m in plan.methods) else ""),
        f"- n = {run.result.n_examples} ({plan.datasets[0]} test examples of at least 20 tokens, first kept by the "
        f"protocol); random head masks {plan.mask_seeds}; wall time of this report's run of it {deep.seconds / 60:.1f} min "
        "(head mask included; the run that filled the results store is in the setting above)",
        "",
        "Kept heads per block:",
        "",
        *_block_table(mask),
    ]
    table, found = _dataset_table(run, list(run.result.groups))
    lines += table
    lines += _ordering_notes(run, found)
    return lines
