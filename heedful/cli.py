"""The ``heedful`` command line: explain texts, list methods and zoo models, build models."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Busy-waiting OpenMP threads cost far more than they save when the cores are shared
# (measured: 232 s vs 31 s for one coperturbation explanation on 2 loaded cores).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from heedful.commands import bench as bench_command
from heedful.commands import heads as heads_command
from heedful.commands import interest as interest_command
from heedful.commands import rectify as rectify_command
from heedful.commands import reproduce as reproduce_command
from heedful.commands import steer as steer_command
from heedful.commands.options import options
from heedful.errors import HeedfulError
from heedful.targets import TASKS

app = typer.Typer(
    name="heedful",
    help="Which input tokens did a transformer rely on, and how far can that answer be trusted?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="List zoo models, or build one.", invoke_without_command=True)
app.add_typer(models_app, name="models")

out = Console()
err = Console(stderr=True)


def _read_texts(texts: list[str], file: str | None) -> list[str]:
    found = list(texts)
    if file is not None:
        stream = sys.stdin if file == "-" else open(file, encoding="utf-8")  # noqa: SIM115
        with stream:
            found.extend(line.rstrip("\n") for line in stream if line.strip())
    if not found:
        raise HeedfulError("no text given", hint='pass TEXT arguments or --file PATH (use "-" for stdin)')
    return found


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


@app.command()
def explain(
    texts: Annotated[list[str] | None, typer.Argument(help="Text(s) to explain.")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")] = "minilm-sentiment",
    method: Annotated[list[str] | None, typer.Option("--method", "-M", help="Method; repeat to compare.")] = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="Class index or label, token, or 'A vs B'.")] = None,
    words: Annotated[bool, typer.Option("--words", help="Aggregate sub-word scores to words.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a heatmap.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML page.")] = None,
    file: Annotated[str | None, typer.Option("--file", "-f", help="Read texts, one per line ('-' = stdin).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b")] = 16,
    no_truncate: Annotated[bool, typer.Option("--no-truncate", help="Fail on texts longer than the model accepts.")] = False,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for stochastic methods.")] = None,
    layerwise: Annotated[bool, typer.Option("--layerwise", help="Layer x token scores (methods that support it).")] = False,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Method option key=value; repeatable.")] = None,
) -> None:
    """Explain TEXT(s) with one or more methods and show a heatmap (or JSON / HTML)."""
    import heedful
    from heedful.render.html import explanation_page
    from heedful.render.terminal import print_explanations

    items = _read_texts(texts or [], file)
    names = method or ["normxlogit"]
    infos = [heedful.get_method(name) for name in names]  # fail fast on unknown names
    extra = options(option, "--option n_steps=100")
    with err.status(f"loading {model} …"):
        loaded = heedful.load(model)
    results: list[heedful.Explanation] = []
    show_bar = len(items) > batch_size
    with _progress() as bar:
        for info in infos:
            kwargs = dict(extra)
            if seed is not None and info.stochastic:
                kwargs["seed"] = seed
            if layerwise:
                if not info.layerwise:
                    raise HeedfulError(f"{info.name} has no layer-wise scores", hint="drop --layerwise")
                kwargs["layerwise"] = True
            task_id = bar.add_task(info.name, total=len(items), visible=show_bar)
            found = loaded.explain(
                items,
                info.name,
                target,
                batch_size=batch_size,
                truncation=not no_truncate,
                progress=lambda n, t=task_id: bar.advance(t, n),
                **kwargs,
            )
            results.extend(found)
    # interleave so each text's methods sit together
    per_method = len(items)
    ordered = [results[m * per_method + i] for i in range(per_method) for m in range(len(infos))]
    if html is not None:
        html.write_text(explanation_page(ordered, words=words), encoding="utf-8")
        err.print(f"wrote {html}")
    if as_json:
        payload = [_json_view(e, words) for e in ordered]
        out.print_json(json.dumps(payload[0] if len(payload) == 1 else payload))
    elif html is None or sys.stdout.isatty():
        print_explanations(ordered, words=words, console=out)


def _json_view(expl, words: bool) -> dict[str, Any]:
    data = expl.to_dict()
    if words:
        data["words"] = expl.words("sum").to_dict()
    return data


@app.command()
def methods() -> None:
    """List the attribution methods with their family, tasks, cost and source."""
    import heedful

    table = Table(title="heedful methods", show_lines=False)
    table.add_column("method", no_wrap=True, style="bold")
    for col in ("family", "tasks", "cost per example", "source"):
        table.add_column(col, overflow="fold")
    for info in heedful.methods():
        tasks = "all" if set(info.tasks) == set(TASKS) else ", ".join(info.tasks)
        table.add_row(info.name, info.family, tasks, info.cost, info.citation)
    out.print(table)


@models_app.callback()
def models_list(ctx: typer.Context) -> None:
    """List zoo models: built or not, size, held-out score."""
    if ctx.invoked_subcommand is not None:
        return
    from heedful import zoo
    from heedful.cache import heedful_home

    table = Table(title=f"heedful zoo  ({heedful_home() / 'models'})")
    table.add_column("name", no_wrap=True, style="bold")
    for col in ("task", "built", "size", "held-out score", "description"):
        table.add_column(col, overflow="fold")
    for row in zoo.list_zoo():
        size = f"{row['disk_mb']:.0f} MB" if row["built"] else f"~{row['size_mb']:.0f} MB"
        table.add_row(
            row["name"] + (" (default)" if row["default"] else ""),
            row["task"],
            "[green]yes[/]" if row["built"] else "no",
            size,
            row["score"] or "-",
            row["description"],
        )
    out.print(table)


@models_app.command("build")
def models_build(
    name: Annotated[str, typer.Argument(help="Zoo model to build.")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if built.")] = False,
) -> None:
    """Build (train or convert) a zoo model into the cache."""
    from heedful import zoo

    path = zoo.build(name, force=force, progress=True)
    out.print(f"built {name} -> {path}")


# ---------------------------------------------------------------- further commands
# One line per command module in heedful/commands (keep heavy imports inside the commands).
app.command("bench")(bench_command.bench)
app.add_typer(interest_command.app, name="interest")
app.command("heads")(heads_command.heads)
app.command("reproduce")(reproduce_command.reproduce)
app.command("rectify")(rectify_command.rectify)
app.command("steer")(steer_command.steer)


def main() -> None:
    """Entry point: user errors print as one message with a hint, exit code 2."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            app()
        except HeedfulError as exc:
            _flush_warnings(caught)
            err.print(f"[bold red]error:[/] {exc.message}")
            if exc.hint:
                err.print(f"[dim]hint:[/] {exc.hint}")
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            raise SystemExit(130) from None
        finally:
            _flush_warnings(caught)


def _flush_warnings(caught: list) -> None:
    for w in caught:
        if "truncated" in str(w.message) or f"{Path('heedful')}" in str(w.filename):
            err.print(f"[yellow]warning:[/] {w.message}")
    caught.clear()


if __name__ == "__main__":  # pragma: no cover
    main()
