"""``heedful interest``: the co-perturbation studies (layer x token map, lambda sweep) as plots.

Registered in :mod:`heedful.cli` as a command group. Heavy imports happen inside the commands.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from heedful.commands.options import options
from heedful.errors import HeedfulError

app = typer.Typer(help="Co-perturbation interest studies: layer x token map, lambda sweep.", no_args_is_help=True)


def settings_options(raw: list[str] | None, **given: Any) -> dict[str, Any]:
    """Optimiser settings: the named options set, then ``key=value`` items, checked (unknown
    names, wrong types, NaN or out of range are one-line errors) before any model loads."""
    from heedful.interest.studies import settings_from

    found = options(raw, "--option window=25", **given)
    settings_from(found).check()
    return found


def check_run(seed: int, out: Path | None = None) -> None:
    """Before any work: a seed torch accepts and an output file that can be written."""
    from heedful.commands.console import check_writable

    if seed < 0:
        raise HeedfulError(f"--seed must be 0 or more, got {seed}", hint="e.g. --seed 0")
    if out is not None:
        check_writable(out, "--out")


def _numbers(raw: str, what: str, cast=float) -> list:
    try:
        values = [cast(x) for x in raw.split(",") if x.strip()]
        if not all(math.isfinite(v) for v in values):
            raise ValueError
    except ValueError:
        raise HeedfulError(f"could not read {what} {raw!r}", hint=f"give comma-separated {what}, e.g. 1,2,3") from None
    if not values:
        raise HeedfulError(f"no {what} given", hint=f"give comma-separated {what}")
    return values


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")]
TargetOpt = Annotated[str | None, typer.Option("--target", "-t", help="Class index or label, token, or 'A vs B'.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the noise draws.")]
StepsOpt = Annotated[int | None, typer.Option("--max-steps", help="Adam steps per problem (default: the method's).")]
SamplesOpt = Annotated[int | None, typer.Option("--samples", help="Noise draws per step.")]
OptionOpt = Annotated[list[str] | None, typer.Option("--option", "-o", help="Optimiser setting key=value (lr, tol, window, scale_factor, ...).")]


@app.command("layers")
def layers_command(
    text: Annotated[str, typer.Argument(help="Sentence to study.")],
    out: Annotated[Path, typer.Option("--out", help="Figure to write (.png, .pdf, .svg).")] = Path("interest-layers.png"),
    model: ModelOpt = "minilm-sentiment",
    target: TargetOpt = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Comma-separated layers (default: all; -1 = last).")] = None,
    lam: Annotated[float | None, typer.Option("--lam", help="Weight of the maximum-entropy term.")] = None,
    seed: SeedOpt = 0,
    max_steps: StepsOpt = None,
    samples: SamplesOpt = None,
    option: OptionOpt = None,
) -> None:
    """Layer x token interest map of TEXT (the paper's Figure 5)."""
    from heedful.commands.console import err, load_model
    from heedful.commands.console import out as console
    from heedful.interest import layer_map
    from heedful.interest.plots import plot_layer_map

    wanted = _numbers(layers, "layers", int) if layers else None
    settings = settings_options(option, lam=lam, max_steps=max_steps, samples=samples)
    check_run(seed, out)
    loaded = load_model(model)
    result = layer_map(loaded, text, target=target, layers=wanted, seed=seed, **settings)  # the solver's steps show as a bar
    path = plot_layer_map(result, out)
    _print_map(console, result)
    err.print(f"wrote {path}")


def _print_map(console, result) -> None:
    from rich.table import Table

    table = Table(title=f"interest by layer (target {result.target}; normalised 1/sigma)")
    table.add_column("token")
    for k in result.layers:
        table.add_column(f"L{k}", justify="right")
    for i, tok in enumerate(result.tokens):
        table.add_row(tok, *[f"{v:.3f}" for v in result.scores[:, i]])
    console.print(table)


@app.command("lambda-sweep")
def lambda_sweep_command(
    text: Annotated[str, typer.Argument(help="Sentence to study.")],
    words: Annotated[list[str], typer.Option("--words", "-w", help="Word of TEXT to follow; repeat for more.")],
    out: Annotated[Path, typer.Option("--out", help="Figure to write (.png, .pdf, .svg).")] = Path("interest-lambda.png"),
    lams: Annotated[str, typer.Option("--lams", help="Comma-separated lambdas.")] = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0",
    model: ModelOpt = "minilm-sentiment",
    target: TargetOpt = None,
    layer: Annotated[int | None, typer.Option("--layer", help="Probe this layer instead of the head's output.")] = None,
    word_token: Annotated[str, typer.Option("--word-token", help="A multi-token word's first or last token.")] = "first",
    seed: SeedOpt = 0,
    max_steps: StepsOpt = None,
    samples: SamplesOpt = None,
    option: OptionOpt = None,
) -> None:
    """Interest of chosen WORDS and the distortion against lambda (the paper's Figure 4)."""
    from heedful.commands.console import err, load_model
    from heedful.commands.console import out as console
    from heedful.interest import lambda_sweep
    from heedful.interest.plots import plot_lambda_sweep
    from heedful.interest.studies import settings_from

    values = _numbers(lams, "lambdas")
    settings = settings_options(option, max_steps=max_steps, samples=samples)
    for value in values:
        settings_from({**settings, "lam": value}).check()
    check_run(seed, out)
    loaded = load_model(model)
    result = lambda_sweep(loaded, text, words, values, target=target, layer=layer, word_token=word_token, seed=seed, **settings)
    path = plot_lambda_sweep(result, out)
    from rich.table import Table

    table = Table(title=f"lambda sweep (target {result.target})")
    table.add_column("lambda", justify="right")
    for w in result.words:
        table.add_column(w, justify="right")
    table.add_column("distortion", justify="right")
    for lam, row, dist in zip(result.lams, result.interest, result.distortion, strict=True):
        table.add_row(f"{lam:g}", *[f"{v:.3f}" for v in row], f"{dist:.4f}")
    console.print(table)
    err.print(f"wrote {path}")
