"""``heedful bench``: faithfulness / plausibility of several methods on a dataset, resumable.

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from heedful.commands.console import announce
from heedful.commands.interrupts import say_interrupted
from heedful.commands.options import key_value
from heedful.engine.memory import parse_memory
from heedful.errors import HeedfulError, Interrupted, install_hint


def _split_list(raw: str, what: str) -> list[str]:
    items = [x.strip() for x in raw.split(",") if x.strip()]
    if not items:
        raise HeedfulError(f"no {what} given", hint=f"pass a comma-separated list of {what}")
    return items


def _parse_options(raw: list[str] | None) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """``method.key=value`` -> per-method options; ``protocol.key=value`` -> protocol changes;
    ``dataset.key=value`` -> dataset options (``dataset.length=512`` for the planted set)."""
    methods: dict[str, dict[str, Any]] = {}
    protocol: dict[str, Any] = {}
    data: dict[str, Any] = {}
    for item in raw or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise HeedfulError(
                f"option {item!r} is not target.key=value",
                hint="e.g. --option integrated_gradients.n_steps=20, --option protocol.max_length=64 or --option dataset.length=512",
            )
        left, parsed = key_value(item)
        owner, key = left.split(".", 1)
        if isinstance(parsed, list):
            parsed = tuple(parsed)
        if owner == "protocol":
            protocol[key] = parsed
        elif owner == "dataset":
            data[key] = parsed
        else:
            methods.setdefault(owner, {})[key] = parsed
    return methods, protocol, data


app = typer.Typer(
    help="Run methods x examples x metrics on a dataset (resumable); subcommands work on results stores.",
    invoke_without_command=True,
)


@app.callback()
def bench(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="movies, amazon, nyt, tweets, agreement, planted (--option dataset.length=1024), or a CSV / JSONL path.")] = None,
    methods: Annotated[str | None, typer.Option("--methods", help="Comma-separated methods, e.g. random,grad_x_input,normxlogit.")] = None,
    metrics: Annotated[str | None, typer.Option("--metrics", help="Comma-separated metrics (default aopc,sufficiency,accuracy; with --generate aopc,sufficiency).")] = None,
    preset: Annotated[str, typer.Option("--preset", "-p", help="Protocol: normxlogit, mask-lrp, ferret or default.")] = "default",
    n: Annotated[int | None, typer.Option("--n", "-n", help="Use the first N usable examples.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder of the results store, tables and plots.")] = Path("results"),
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "test",
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic methods (random baseline: seed..seed+k-1).")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Examples per model batch.")] = 16,
    random_seeds: Annotated[int | None, typer.Option("--random-seeds", help="Seeds of the random baseline (default: the preset's).")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="method.key=value, protocol.key=value or dataset.key=value; repeatable.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads (default: torch's choice).")] = None,
    lm_word: Annotated[str, typer.Option("--lm-word", help="Language-model data: explain the 'target' or the 'foil' word.")] = "target",
    generate: Annotated[int | None, typer.Option("--generate", "-g", help="Prompts data (JSONL with 'prompt', optional 'continuation'): explain N generated tokens per prompt.")] = None,
    max_memory: Annotated[str | None, typer.Option("--max-memory", help="Memory one pass may use, e.g. 4GB or 512MiB (default: half of the free memory).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Store and run the model in fp32 (default), bf16 or fp16; gradient and relevance sums stay float32 (see docs/models.md for each method's difference from fp32).")] = "fp32",
    precision: Annotated[str, typer.Option("--precision", help="fp32, bf16, int8 or auto: forward passes of the curves and of forward-only methods (leave_one_out, lime, kernel_shap, rise) at this precision; auto: the fastest each tolerates on this machine (see heedful info). The store keys the precision used when not fp32.")] = "fp32",
    strict: Annotated[bool, typer.Option("--strict", help="Refuse a --precision this machine runs slower than fp32 (default: run it with a warning).")] = False,
    engine: Annotated[str, typer.Option("--engine", help=f"local (this process) or ray (worker actors on a Ray cluster; {escape(install_hint('ray'))}).")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="With --engine ray: auto or ray://host:10001 to join a cluster (default: start a local one).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="With --engine ray: worker actors, one CPU each (default: the cluster's CPUs).")] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Removal operator of the curves: delete, mask, unk, pad or sample (a corpus word of the same part of speech: in-distribution); default: the preset's.")] = None,
) -> None:
    """Run METHODS x examples x METRICS under a paper's protocol; results are stored per example
    in OUT/results.sqlite, so an interrupted run resumes where it stopped. With --generate, the
    dataset is a file of prompts: every method explains each generated (or given) continuation
    and is measured by comprehensiveness and sufficiency of its log-probability."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [flag for flag, value in (("--model", model), ("--dataset", dataset), ("--methods", methods)) if value is None]
    if missing:
        raise HeedfulError(f"heedful bench needs {', '.join(missing)}", hint="e.g. heedful bench --model minilm-sentiment --dataset movies --methods random,grad_x_input --n 50")
    _check_run_options(n, batch_size, out)
    _check_engine(engine, address, workers, generate)
    from rich.console import Console

    from heedful.evaluate import get_protocol, metric_names
    from heedful.evaluate.bench import BenchSpec, check_options, run_bench
    from heedful.evaluate.report import write_report

    out_console, err_console = Console(), Console(stderr=True)
    if threads is not None:
        if threads < 1:
            raise HeedfulError(f"--threads must be positive, got {threads}")
        import torch

        torch.set_num_threads(threads)
    budget = None if max_memory is None else parse_memory(max_memory)
    from heedful.engine.precision import check_dtype

    check_dtype(dtype)  # a bad --dtype fails before any work
    method_options, protocol_changes, data_options = _parse_options(option)
    if generate is not None:
        if precision != "fp32":
            raise HeedfulError("--precision applies to benches of a dataset, not to --generate", hint="drop --precision")
        if data_options:
            raise HeedfulError("--generate reads a prompts file, which takes no dataset options", hint="drop the dataset.* options")
        _bench_generation(model, dataset, _split_list(methods, "methods"), method_options, metrics or "aopc,sufficiency", generate, n, out, budget, dtype)
        return
    metrics = metrics or "aopc,sufficiency,accuracy"
    if random_seeds is not None:
        protocol_changes["random_seeds"] = random_seeds
    if operator is not None:
        protocol_changes["removal"] = operator
    from heedful.engine.precision import (  # imports torch: only when a bench runs
        check_precision,
        strict_precision,
    )

    if check_precision(precision, auto=True) != "fp32":
        protocol_changes.setdefault("precision", precision)
    protocol = get_protocol(preset, **protocol_changes)
    names, metric_list = _split_list(methods, "methods"), metric_names(metrics)
    method_options = check_options(names, method_options)  # bad options fail before the model loads
    if precision != "fp32":
        _forward_only_precision(names, method_options, precision)
    if data_options:
        from heedful.datasets.loading import check_options as check_dataset_options

        check_dataset_options(dataset, data_options)
    with err_console.status(f"loading {model} …"):
        import heedful

        loaded = heedful.load(model, max_memory=budget, dtype=dtype)
    spec = BenchSpec(
        model=loaded,
        dataset=dataset,
        methods=names,
        metrics=metric_list,
        protocol=protocol,
        out=out,
        split=split,
        n=n,
        seed=seed,
        batch_size=batch_size,
        method_options=method_options,
        dataset_options=data_options,
        lm_word=lm_word,
    )
    runner = _engine(engine, address, workers, threads, model, budget, dtype)
    try:
        with strict_precision(strict):
            result = run_bench(spec, console=err_console, engine=runner, on_plan=lambda plan: announce(plan.work, "explanations"))
    except Interrupted as exc:  # Ctrl-C: what the store kept, and how to resume
        say_interrupted(exc.message)
        raise typer.Exit(130) from None
    files = write_report(result)
    extra = result.engine.lines() if result.engine is not None and engine == "ray" else []
    _print_result(result, files, out_console, err_console, "computed", extra)


def _print_result(result, files, out_console, err_console, verb: str, extra: list[str] = ()) -> None:
    """A bench's table on stdout; its notes, ``extra`` lines, what this run ``verb`` (computed /
    stored) and the files written on stderr."""
    from heedful.evaluate.report import rich_table

    out_console.print(rich_table(result))
    for line in [*result.notes, *extra]:
        err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    computed = result.computed
    err_console.print(
        f"[dim]{verb} this run: {computed['explanations']} explanations, {computed['measurements']} curve records, "
        f"{computed['metrics']} metric values · store: {escape(str(result.store_path))}[/]"
    )
    for path in files:
        err_console.print(f"wrote {path}", markup=False, highlight=False)


def _forward_only_precision(names: list[str], method_options: dict[str, dict[str, Any]], precision: str) -> None:
    """``--precision``: every method of ``names`` that takes a ``precision`` option runs at
    ``precision`` unless ``--option METHOD.precision=...`` says otherwise."""
    from heedful.attribution import get_method

    for name in names:
        info = get_method(name, None)
        if info.takes("precision"):
            method_options.setdefault(info.name, {}).setdefault("precision", precision)


@app.command("merge")
def merge(
    out: Annotated[Path, typer.Argument(help="Folder (or .sqlite file) of the merged store; created when missing.")],
    stores: Annotated[list[Path], typer.Argument(help="Results stores to merge: --out folders of heedful bench, or .sqlite files.")],
) -> None:
    """Merge results stores of one bench computed in shards (one --out per machine or method)
    into OUT. A row in two stores must be identical, else nothing of that store is merged."""
    from rich.console import Console

    from heedful.evaluate.merge import merge_stores

    Console(stderr=True).print(merge_stores(out, stores).line(), highlight=False, markup=False, soft_wrap=True)


@app.command("dump")
def dump(
    folder: Annotated[Path, typer.Argument(help="Results folder: a --out of heedful bench, or a heedful reproduce store folder.")],
    archive: Annotated[Path, typer.Argument(help="Folder to write the text archive into (created when missing).")],
) -> None:
    """Write every results store under FOLDER as sorted JSON Lines into ARCHIVE (sixteen shards
    a store, by the first hex digit of each row's run key, so that no file nears a code host's
    100 MB limit), and copy the files beside them, so the results can be committed and loaded on
    another machine."""
    from rich.console import Console

    from heedful.evaluate.archive import dump_folder

    Console(stderr=True).print(dump_folder(folder, archive).line("dumped", folder, archive), highlight=False, markup=False, soft_wrap=True)


@app.command("load")
def load(
    archive: Annotated[Path, typer.Argument(help="A folder written by heedful bench dump.")],
    folder: Annotated[Path, typer.Argument(help="Results folder to merge it into (created when missing).")],
) -> None:
    """Merge a text archive of heedful bench dump into FOLDER: its stores row by row (a row on
    both sides must be identical), its other files where FOLDER lacks them."""
    from rich.console import Console

    from heedful.evaluate.archive import load_archive

    Console(stderr=True).print(load_archive(archive, folder).line("loaded", archive, folder), highlight=False, markup=False, soft_wrap=True)


def _check_engine(engine: str, address: str | None, workers: int | None, generate: int | None) -> None:
    """Engine options checked before any work: a known engine, Ray installed for ``ray``."""
    if engine not in ("local", "ray"):
        raise HeedfulError(f"unknown engine {engine!r}", hint="use --engine local or --engine ray")
    if engine == "local" and (address is not None or workers is not None):
        raise HeedfulError("--address and --workers need --engine ray", hint="add --engine ray, or drop them")
    if engine == "ray":
        if generate is not None:
            raise HeedfulError("--generate runs with the local engine only", hint="drop --engine ray")
        if workers is not None and workers < 1:
            raise HeedfulError(f"--workers must be at least 1, got {workers}")
        from heedful.evaluate.ray_engine import import_ray

        import_ray()


def _engine(engine: str, address: str | None, workers: int | None, threads: int | None, model: str, budget: int | None, dtype: str = "fp32"):
    """``None`` (the local engine) or a Ray engine whose workers each load ``model`` (in ``dtype``) once."""
    if engine == "local":
        return None
    from heedful.evaluate.ray_engine import RayEngine
    from heedful.loading import loader

    return RayEngine(loader(model, max_memory=budget, dtype=dtype), workers, address, threads=threads or 1)


GENERATION_METRICS = {"aopc", "comprehensiveness", "sufficiency"}


def _bench_generation(model, dataset, names, method_options, metrics, generate, n, out: Path, budget: int | None = None, dtype: str = "fp32") -> None:
    """``heedful bench --generate N``: generation faithfulness of every method on a prompts file
    (not stored: every run recomputes), written to OUT/generation.md and OUT/generation.csv."""
    from rich.console import Console
    from rich.markdown import Markdown

    from heedful.datasets.prompts import load_prompts
    from heedful.evaluate.bench import check_options
    from heedful.evaluate.generation import bench_generation, generation_report, generation_rows

    asked = set(_split_list(metrics, "metrics"))
    if not asked <= GENERATION_METRICS:
        raise HeedfulError(
            f"generation faithfulness measures {', '.join(sorted(GENERATION_METRICS))}, not {', '.join(sorted(asked - GENERATION_METRICS))}",
            hint="drop --metrics, or use aopc,sufficiency",
        )
    if generate < 1:
        raise HeedfulError(f"--generate must be at least 1, got {generate}")
    method_options = check_options(names, method_options)
    prompts = load_prompts(dataset, n)
    err = Console(stderr=True)
    with err.status(f"loading {model} …"):
        import heedful

        loaded = heedful.load(model, max_memory=budget, dtype=dtype)
    with err.status(f"explaining {len(prompts)} generations with {len(names)} methods …"):
        results = bench_generation(loaded, prompts, names, method_options, max_new_tokens=generate)
    report = generation_report(results, loaded.name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generation.md").write_text(report, encoding="utf-8")
    import pandas as pd

    pd.DataFrame(generation_rows(results)).to_csv(out / "generation.csv", index=False)
    Console().print(Markdown(report))
    err.print(f"wrote {out / 'generation.md'} and {out / 'generation.csv'}")


# ---------------------------------------------------------------------------- export / import
@app.command("export")
def export_command(
    store: Annotated[Path, typer.Argument(help="A results store: the --out folder of a bench run (or its results.sqlite).")],
    format: Annotated[str, typer.Option("--format", "-f", help="parquet (list columns; needs pyarrow) or csv (lists as JSON).")] = "parquet",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="File to write (default: STORE/bench.FORMAT); the manifest goes beside it.")] = None,
) -> None:
    """Export every explanation and per-example metric value of a results store as one table
    (one row per example x method x metric; schema in docs/bench.md), with a run manifest JSON
    (heedful version, fingerprints, options, seeds, protocols, machine) beside it."""
    from rich.console import Console

    from heedful.evaluate.export import FORMATS, export_store, open_store

    if format not in FORMATS:
        raise HeedfulError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "parquet":
        from heedful.evaluate.export import require_pyarrow

        require_pyarrow()
    with open_store(store) as opened:
        target = out if out is not None else opened.path.parent / f"bench.{format}"
        done = export_store(opened, target, format)
    Console(stderr=True).print(f"wrote {done.path} ({done.rows} rows) and {done.manifest}", highlight=False, markup=False)


@app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="Explanations: JSON / JSON lines / CSV / Parquet records, a Captum .pt file, or an Inseq .json file.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id the explanations are of.")],
    name: Annotated[str | None, typer.Option("--name", help="Method name to store and show them under (default: the file's stem).")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="The dataset the explanations are of (default: the file's own texts).")] = None,
    metrics: Annotated[str, typer.Option("--metrics", help="Comma-separated metrics.")] = "aopc,sufficiency,accuracy",
    preset: Annotated[str, typer.Option("--preset", "-p", help="Protocol: normxlogit, mask-lrp, ferret or default.")] = "default",
    methods: Annotated[str | None, typer.Option("--methods", help="heedful methods to run beside them on the same examples.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="auto, json (also JSON lines), csv, parquet, captum or inseq.")] = "auto",
    from_method: Annotated[str | None, typer.Option("--from-method", help="A table of several methods (heedful bench export): import this one.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder of the results store, tables and plots.")] = Path("results"),
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "test",
    n: Annotated[int | None, typer.Option("--n", "-n", help="Use the first N explained examples.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of stochastic methods run beside them.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Examples per model batch.")] = 16,
    steps: Annotated[str, typer.Option("--steps", help="Inseq files: explain every generated token (all) or the first.")] = "all",
    option: Annotated[list[str] | None, typer.Option("--option", help="method.key=value, protocol.key=value or dataset.key=value; repeatable.")] = None,
) -> None:
    """Score explanations computed elsewhere (Captum, Inseq, your own code) with heedful's
    metrics and presets: aligned to the model's tokens, stored under --name in OUT's results
    store and shown beside heedful's methods (those given with --methods and those already
    stored for this model and dataset)."""
    from rich.console import Console

    from heedful.evaluate import get_protocol, metric_names
    from heedful.evaluate.bench import check_options
    from heedful.evaluate.bench_import import ImportSpec, run_import
    from heedful.evaluate.report import write_report

    out_console, err_console = Console(), Console(stderr=True)
    method_options, protocol_changes, data_options = _parse_options(option)
    if data_options and dataset is None:
        raise HeedfulError("dataset options need --dataset", hint="add --dataset NAME, or drop the dataset.* options")
    protocol = get_protocol(preset, **protocol_changes)
    metric_list = metric_names(metrics)
    names = _split_list(methods, "methods") if methods else []
    method_options = check_options(names, method_options)
    if not file.expanduser().is_file():
        raise HeedfulError(f"no such file: {file}", hint="give the path of the explanations file")
    _check_run_options(n, batch_size, out)
    with err_console.status(f"loading {model} …"):
        import heedful

        loaded = heedful.load(model)
    spec = ImportSpec(
        model=loaded, file=file, name=name or file.name.split(".")[0], metrics=metric_list, protocol=protocol, out=out,
        dataset=dataset, split=split, format=format, method=from_method, methods=names, method_options=method_options,
        n=n, seed=seed, batch_size=batch_size, dataset_options=data_options, steps=steps,
    )
    result = run_import(spec, console=err_console)
    files = write_report(result)
    _print_result(result, files, out_console, err_console, "stored")


def _check_run_options(n: int | None, batch_size: int, out: Path) -> None:
    """Before any work: a positive --n and --batch-size, and an --out folder that can be written."""
    from heedful.commands.console import check_writable

    if n is not None and n < 1:
        raise HeedfulError(f"--n must be at least 1, got {n}", hint="drop --n to use the whole split")
    if batch_size < 1:
        raise HeedfulError(f"--batch-size must be at least 1, got {batch_size}", hint="e.g. --batch-size 16")
    check_writable(out, "--out", folder=True)
