"""``heedful probe``: linear probes on every layer (accuracy, control accuracy, selectivity, MDL
codelength, expected layer) and amnesic probing. Registered in :mod:`heedful.cli`; heavy
imports happen inside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def probe(
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")] = "minilm-sentiment",
    prop: Annotated[str, typer.Option("--property", "-p", help="pos, dep, entity (spaCy silver labels), number (agreement pairs) or label.")] = "pos",
    layers: Annotated[str, typer.Option("--layers", "-l", help="'all' or comma-separated layers (0 = embeddings).")] = "all",
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="movies, amazon, nyt, tweets, agreement, or a CSV / JSONL path (default: agreement for number, else movies).")] = None,
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "train",
    n: Annotated[int, typer.Option("--n", "-n", help="Use the first N texts.")] = 200,
    pooling: Annotated[str, typer.Option("--pooling", help="Span pooling over its tokens: mean, first or last.")] = "mean",
    control: Annotated[bool, typer.Option("--control/--no-control", help="Hewitt & Liang's control task and selectivity.")] = True,
    mdl: Annotated[bool, typer.Option("--mdl", help="Also the MDL online codelength (Voita & Titov 2020).")] = False,
    expected: Annotated[bool, typer.Option("--expected-layer/--no-expected-layer", help="Cumulative scalar-mix probes and the expected layer (Tenney et al. 2019).")] = True,
    amnesic: Annotated[int | None, typer.Option("--amnesic", help="Also remove the property from this layer (INLP) and report the model's task.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Layer plot (PNG/SVG/PDF; default probe-MODEL-PROPERTY.png).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split, the control labels and the MDL order.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Texts per forward pass.")] = 16,
) -> None:
    """Train a linear probe per layer for PROPERTY and print its test accuracy, the control
    task's accuracy and the selectivity (and the MDL codelength with --mdl), the expected layer,
    and write a layer plot. With --amnesic L, remove the property from layer L by iterative
    nullspace projection and report what the model's own task loses."""
    from rich.table import Table

    from heedful.commands.console import check_writable, err, load_model, out
    from heedful.datasets import load as load_dataset
    from heedful.errors import InputError
    from heedful.inside.amnesic import amnesic as run_amnesic
    from heedful.inside.probing import probe as run_probe
    from heedful.inside.properties import DEFAULT_DATASET, check_property
    from heedful.inside.representations import POOLINGS

    check_property(prop)
    if pooling not in POOLINGS:
        raise InputError(f"unknown pooling {pooling!r}", hint=f"--pooling {' | '.join(POOLINGS)}")
    for flag, value in (("--n", n), ("--batch-size", batch_size)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}", hint=f"drop {flag} for the default")
    chosen = _parse_layers(layers)
    picture = plot if plot is not None else Path(f"probe-{Path(model).name}-{prop}.png")
    check_writable(picture, "--plot")
    loaded = load_model(model)
    data = load_dataset(dataset or DEFAULT_DATASET[prop], split, n)
    result = run_probe(
        loaded, data, prop, chosen, pooling=pooling, control=control, mdl=mdl, expected_layer=expected, seed=seed, batch_size=batch_size
    )
    forgotten = None
    if amnesic is not None:
        forgotten = run_amnesic(loaded, data, prop, amnesic, pooling=pooling, seed=seed, batch_size=batch_size)
    result.plot(picture)
    if as_json:
        out.print_json(json.dumps({**result.to_dict(), "amnesic": None if forgotten is None else forgotten.to_dict()}))
    else:
        table = Table(title=f"{prop} probes of {loaded.name}: {result.train_items} train / {result.test_items} test items, majority class {result.majority:.3f}")
        columns = ["layer", "accuracy"] + (["control", "selectivity"] if control else []) + (["codelength (kbit)", "compression"] if mdl else [])
        for column in columns:
            table.add_column(column, justify="right")
        for s in result.scores:
            row = [str(s.layer), f"{s.accuracy:.3f}"]
            if control:
                row += [f"{s.control_accuracy:.3f}", f"{s.selectivity:+.3f}"]
            if mdl:
                row += [f"{s.codelength / 1000:.2f}", f"{s.compression:.2f}"]
            table.add_row(*row)
        out.print(table)
        if result.expected_layer is not None:
            out.print(f"expected layer (Tenney et al. Eq. 4): {result.expected_layer:.2f}; scalar-mix centre of gravity: {result.mix_center:.2f}")
        if forgotten is not None:
            out.print(
                f"amnesic probing at layer {forgotten.layer}: {forgotten.rank} directions removed, probe accuracy "
                f"{forgotten.probe_before:.3f} -> {forgotten.probe_after:.3f} (majority {forgotten.majority:.3f}); "
                f"{forgotten.task} {forgotten.task_before:.3f} -> {forgotten.task_amnesic:.3f} "
                f"(as many random directions: {forgotten.task_random:.3f})"
            )
    err.print(f"wrote {picture}")


def _parse_layers(text: str) -> list[int] | str:
    from heedful.errors import InputError

    if text.strip() == "all":
        return "all"
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--layers takes 'all' or comma-separated numbers, not {text!r}", hint="e.g. --layers all or --layers 0,3,6") from None
