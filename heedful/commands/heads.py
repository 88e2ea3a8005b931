"""``heedful heads``: Mask-LRP head statistics and head mask of a model on a dataset.

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer


class _LazyParser:
    """Loads spaCy only when a parse is not cached."""

    def __init__(self, factory) -> None:
        self.factory = factory
        self.nlp = None

    def pipe(self, texts, batch_size: int = 256):
        if self.nlp is None:
            self.nlp = self.factory()
        return self.nlp.pipe(texts, batch_size=batch_size)


def heads(
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")] = "minilm-sentiment",
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="movies, amazon, nyt, tweets, or a CSV / JSONL path.")] = "movies",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Mask JSON to write (default: the model's cached mask).")] = None,
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "train",
    n: Annotated[int | None, typer.Option("--n", "-n", help="Use the first N texts.")] = None,
    xi_synt: Annotated[float, typer.Option("--xi-synt", help="Eq. 7 margin over the best fixed-offset baseline.")] = 0.1,
    xi_pos: Annotated[float, typer.Option("--xi-pos", help="Eq. 8 threshold on a relative position's frequency.")] = 0.8,
    no_self: Annotated[bool, typer.Option("--no-self", help="Do not count offset 0 as a position.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Layer x head map PNG (default: next to --out).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Texts per forward pass.")] = 32,
) -> None:
    """Parse DATASET with spaCy, measure every attention head's syntactic accuracy (nsubj, obj,
    amod, advmod) against fixed-offset baselines and its positional argmax frequencies, select
    the heads Mask-LRP keeps, and save the mask with its statistics (JSON) and its map (PNG)."""
    from rich.console import Console
    from rich.table import Table

    from heedful.commands.console import check_writable, load_model, progress
    from heedful.datasets import load as load_dataset
    from heedful.errors import InputError
    from heedful.fingerprint import model_fingerprint
    from heedful.lrp.heads import PARSER, cached_arcs, head_statistics, load_parser, plot_head_map
    from heedful.lrp.masks import RELATIONS, cache_path

    if not 0 <= xi_pos <= 1:
        raise InputError(f"--xi-pos must be in [0, 1], got {xi_pos}", hint="e.g. --xi-pos 0.8")
    if not math.isfinite(xi_synt):
        raise InputError(f"--xi-synt must be a finite number, got {xi_synt}", hint="e.g. --xi-synt 0.1")
    for flag, value in (("--n", n), ("--batch-size", batch_size)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}", hint=f"drop {flag} for the default")
    for flag, path in (("--out", out), ("--plot", plot)):
        if path is not None:
            check_writable(path, flag)  # before the parse and the passes
    loaded = load_model(model)
    loaded.adapter.num_layers  # noqa: B018  (fail early on a model without blocks)
    nlp = _LazyParser(load_parser)
    texts = [ex.text for ex in load_dataset(dataset, split, n)]
    meta = {
        "model": loaded.name, "fingerprint": model_fingerprint(loaded.adapter).digest,
        "dataset": dataset, "split": split, "limit": n, "parser": PARSER,
    }
    with progress() as bar:
        parsing = bar.add_task(f"parsing {len(texts)} texts", total=len(texts))
        arcs = cached_arcs(texts, f"{Path(dataset).name}-{split}", nlp=nlp, progress=lambda k: bar.advance(parsing, k))
        counting = bar.add_task("head statistics", total=len(texts))
        stats = head_statistics(
            loaded.adapter, texts, arcs=arcs, batch_size=batch_size, progress=lambda k: bar.advance(counting, k), meta=meta
        )
    mask = stats.select(xi_synt, xi_pos, include_self=not no_self)
    path = mask.save(out if out is not None else cache_path(loaded, dataset=dataset, split=split, limit=n))
    picture = plot_head_map(mask, plot if plot is not None else path.with_suffix(".png"))

    console = Console()
    table = Table(title=f"{loaded.name} on {dataset} {split}: {len(texts)} texts")
    for col in ("relation", "dependents", "best offset", "baseline", "threshold", "heads above"):
        table.add_column(col, justify="right" if col != "relation" else "left")
    base = mask.statistics["baseline"]
    for k, rel in enumerate(RELATIONS):
        table.add_row(
            rel,
            str(int(stats.totals[k])),
            f"{base[rel]['best_offset']:+d}",
            f"{base[rel]['accuracy']:.3f}",
            f"{base[rel]['threshold']:.3f}",
            str(int(mask.syntactic[..., k].sum())),
        )
    console.print(table)
    kept = int(mask.mask.sum())
    console.print(
        f"syntactic heads {int(mask.syntactic.any(-1).sum())}, positional heads {int(mask.positional.sum())}; "
        f"kept {kept}/{mask.mask.size} heads (mask rate {mask.rate:.1%})"
    )
    console.print(f"wrote {path}\nwrote {picture}")
