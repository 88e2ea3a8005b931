"""``heedful rectify``: suppress the tokens an attribution ranks highest in a classifier's errors
and count the errors fixed (the co-perturbation paper's Section 5.4.1 and Figure 8).

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from heedful.commands.options import key_value
from heedful.errors import HeedfulError


def _methods(raw: list[str] | None) -> list[str]:
    names = [x.strip() for item in raw or ["coperturbation"] for x in item.split(",") if x.strip()]
    if not names:
        raise HeedfulError("no method given", hint="e.g. --method coperturbation,leave_one_out")
    return list(dict.fromkeys(names))


def _ratios(raw: str) -> list[float]:
    try:
        values = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise HeedfulError(f"could not read the ratios {raw!r}", hint="e.g. --ratios 0.1,0.2,0.3") from None
    if not values:
        raise HeedfulError("no ratio given", hint="e.g. --ratios 0.1,0.2,0.3")
    return sorted(set(values))


def method_options(raw: list[str] | None, methods: list[str]) -> dict[str, dict[str, Any]]:
    """``key=value`` goes to every method that takes ``key``; ``method.key=value`` to that
    method only. Values are read as JSON where they parse. A key no method takes, or a value its
    method does not accept, is an error."""
    import heedful

    infos = {m: heedful.get_method(m) for m in methods}
    found: dict[str, dict[str, Any]] = {}
    for item in raw or []:
        left, parsed = key_value(item, "--option max_steps=200 or --option lime.n_samples=200")
        owner, _, key = left.rpartition(".")
        if owner and owner not in methods:
            raise HeedfulError(f"option {item!r} names {owner!r}, which is not one of the methods run", hint=f"methods: {', '.join(methods)}")
        takers = [owner] if owner else [m for m in methods if infos[m].takes(key)]
        if not takers:
            raise HeedfulError(f"no method run takes the option {key!r}", hint="see `heedful methods` and the methods' docs")
        for m in takers:
            found.setdefault(m, {})[key] = parsed
    for m, given in found.items():
        infos[m].bind(given)  # a value a method does not accept fails before the model loads
    return found


def rectify(
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name or model directory (a classifier).")] = "minilm-sentiment",
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="movies, amazon, nyt, tweets, or a CSV / JSONL path.")] = "movies",
    method: Annotated[list[str] | None, typer.Option("--method", "-M", help="Attribution method(s): repeat or comma-separate to compare.")] = None,
    ratio: Annotated[float, typer.Option("--ratio", "-r", help="Share of each error example's tokens to suppress.")] = 0.2,
    sweep: Annotated[bool, typer.Option("--sweep", help="Run a range of ratios; write the curve (PNG) and CSV.")] = False,
    ratios: Annotated[str | None, typer.Option("--ratios", help="Ratios of the sweep (default 0.05,0.1,..,0.5).")] = None,
    n: Annotated[int | None, typer.Option("--n", "-n", help="Use the first N examples of the split.")] = None,
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "test",
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the CSV and the curve.")] = Path("results"),
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic methods.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Error examples explained per batch.")] = 16,
    max_length: Annotated[int | None, typer.Option("--max-length", help="Truncate inputs to this many tokens.")] = None,
    store: Annotated[Path | None, typer.Option("--store", help="Results-store folder: reuse and keep explanations.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="Method option key=value (or method.key=value); repeatable.")] = None,
) -> None:
    """Rectify a classifier's errors: for each example it gets wrong, suppress the top RATIO of
    tokens by the METHOD's attribution toward the (wrong) prediction, classify again, and report
    the share of errors fixed and the accuracy on the whole split (only the error examples are
    modified, as in the co-perturbation paper)."""
    from rich.console import Console

    import heedful
    from heedful.interest import rectify as rect

    out_console, err_console = Console(), Console(stderr=True)
    names = _methods(method)
    for name in names:
        heedful.get_method(name)  # unknown names fail before the model loads
    options = method_options(option, names)
    wanted = (_ratios(ratios) if ratios else list(rect.SWEEP_RATIOS)) if sweep else [ratio]
    _check_run(wanted, n, batch_size, seed, max_length, out if sweep or out != Path("results") else None, store)
    with err_console.status(f"loading {model} …"):
        loaded = heedful.load(model)
    result = rect.rectify(  # its progress shows in the command's bars (heedful.progress)
        loaded, dataset, names, wanted, split=split, n=n, seed=seed, method_options=options,
        batch_size=batch_size, max_length=max_length, store=store,
    )
    out_console.print(summary_table(result))
    for note in result.notes:
        err_console.print(note, highlight=False, markup=False)
    if sweep:
        out_console.print(sweep_table(result))
    err_console.print(
        f"[dim]{result.n_errors} of {result.n_total} examples misclassified (accuracy {result.accuracy_before:.1%}); "
        "only those are modified, so whole-split gains count fixed errors and never broken correct examples.[/]"
    )
    if sweep or out != Path("results"):
        out.mkdir(parents=True, exist_ok=True)
        stem = f"rectify-{_slug(Path(model).name if Path(model).exists() else model)}-{_slug(Path(dataset).stem)}"
        err_console.print(f"wrote {rect.write_csv(result, out / f'{stem}.csv')}")
        if sweep:
            err_console.print(f"wrote {rect.plot_sweep(result, out / f'{stem}.png')}")


def _check_run(ratios, n, batch_size, seed, max_length, out: Path | None, store: Path | None) -> None:
    """Before the model loads: counts and ratios in range, output folders that can be written."""
    from heedful.commands.console import check_writable

    if any(not 0.0 < r <= 1.0 for r in ratios):
        raise HeedfulError(f"ratios must lie in (0, 1], got {', '.join(f'{r:g}' for r in ratios)}", hint="e.g. --ratio 0.2")
    for flag, value in (("--n", n), ("--batch-size", batch_size), ("--max-length", max_length)):
        if value is not None and value < 1:
            raise HeedfulError(f"{flag} must be at least 1, got {value}", hint=f"drop {flag} for the default")
    if seed < 0:
        raise HeedfulError(f"--seed must be 0 or more, got {seed}", hint="e.g. --seed 0")
    for flag, folder in (("--out", out), ("--store", store)):
        if folder is not None:
            check_writable(folder, flag, folder=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "data"


def summary_table(result):
    """Rich table: each method at its best ratio (most errors fixed)."""
    from rich.table import Table

    sweep = len(result.ratios) > 1
    from heedful.evaluate.report import short_model

    title = f"rectification of {short_model(result.model)} on {result.dataset} ({result.split}): {result.n_errors} errors of {result.n_total}"
    table = Table(title=title + (" — best ratio per method" if sweep else f" — ratio {result.ratios[0]:g}"))
    table.add_column("method", style="bold", no_wrap=True)
    if sweep:
        table.add_column("best r", justify="right")
    for col in ("errors fixed", "error-set gain", "accuracy before → after", "whole-split gain", "tokens erased", "s / error"):
        table.add_column(col, justify="right")
    for name, gain in result.methods.items():
        r = result.best(name)
        row = [name] + ([f"{result.ratios[r]:g}"] if sweep else [])
        row += [
            f"{int(gain.fixed[r])} / {result.n_errors}",
            f"{result.error_gain(name)[r]:.1%}",
            f"{result.accuracy_before:.2%} → {result.accuracy_after(name)[r]:.2%}",
            f"+{100 * result.whole_gain(name)[r]:.2f} pts",
            f"{gain.erased[r]:.1f}",
            "stored" if gain.from_store and not gain.seconds else f"{gain.seconds:.2f}",
        ]
        table.add_row(*row)
    return table


def sweep_table(result):
    """Rich table: share of errors fixed for every method (columns) at every ratio (rows)."""
    from rich.table import Table

    table = Table(title="errors fixed (share of the error set) against the erasure ratio")
    table.add_column("ratio", justify="right")
    for name in result.methods:
        table.add_column(name, justify="right")
    for r, ratio in enumerate(result.ratios):
        table.add_row(f"{ratio:g}", *[f"{result.error_gain(name)[r]:.1%}" for name in result.methods])
    return table
