"""The ``heedful`` command line: explain texts, list methods and zoo models, build models."""

from __future__ import annotations

import functools
import json
import operator
import os
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# Busy-waiting OpenMP threads cost far more than they save when the cores are shared
# (measured: 232 s vs 31 s for one coperturbation explanation on 2 loaded cores).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from heedful.commands import at2 as at2_command
from heedful.commands import bench as bench_command
from heedful.commands import counterfactual as counterfactual_command
from heedful.commands import heads as heads_command
from heedful.commands import info as info_command
from heedful.commands import interest as interest_command
from heedful.commands import probe as probe_command
from heedful.commands import rectify as rectify_command
from heedful.commands import reproduce as reproduce_command
from heedful.commands import serve as serve_command
from heedful.commands import steer as steer_command
from heedful.commands import trace as trace_command
from heedful.commands import warm as warm_command
from heedful.commands.console import (
    announce,
    bars,
    check_writable,
    err,
    load_model,
    out,
    print_error,
    progress,
    read_text_file,
)
from heedful.commands.interrupts import noticing
from heedful.commands.options import options
from heedful.engine.memory import parse_memory
from heedful.errors import HeedfulError, InputError, did_you_mean

app = typer.Typer(
    name="heedful",
    help="Which input tokens did a transformer rely on, and how far can that answer be trusted?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
PROGRESS_FLAGS = ("--quiet", "--progress", "--no-warm")
"""Options of every command, wherever they stand on the command line (see :func:`main`)."""


@app.callback()
def _everywhere(
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars (also HEEDFUL_PROGRESS=never).")] = False,
    show_progress: Annotated[
        bool, typer.Option("--progress", help="Progress even where stderr is no terminal: a line per tenth of a task (also HEEDFUL_PROGRESS=always).")
    ] = False,
    no_warm: Annotated[  # read by heedful.launch before this runs
        bool, typer.Option("--no-warm", help="Run in this process, not in the warm worker, and start none (also HEEDFUL_WARM=never; see `heedful warm`).")
    ] = False,
) -> None:
    """Which input tokens did a transformer rely on, and how far can that answer be trusted?

    Long work shows progress bars with an estimate of the time left on stderr, on a terminal."""
    if quiet and show_progress:
        raise HeedfulError("--quiet and --progress contradict each other", hint="give one of them")
    if quiet or show_progress:
        bars.configure("never" if quiet else "always")


models_app = typer.Typer(help="List zoo models, or build one.", invoke_without_command=True)
app.add_typer(models_app, name="models")

def _read_texts(texts: list[str], file: str | None) -> list[str]:
    found = list(texts)
    if file is not None:
        found.extend(line.rstrip("\r") for line in read_text_file(file).split("\n") if line.strip())
    if not found:
        raise HeedfulError("no text given", hint='pass TEXT arguments or --file PATH (use "-" for stdin)')
    return found


def _read_document(texts: list[str], file: str | None) -> list[str]:
    """The documents to cut into sources: each TEXT argument, and the whole of ``file``."""
    found = list(texts)
    if file is not None:
        document = read_text_file(file)
        if document.strip():
            found.append(document.rstrip("\n"))
    if not found:
        raise HeedfulError("no text given", hint='pass TEXT arguments or --file PATH (use "-" for stdin)')
    return found


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
    device: Annotated[str, typer.Option("--device", help="Where the model runs: cpu, cuda, cuda:1, mps.")] = "cpu",
    dtype: Annotated[str, typer.Option("--dtype", help="Store and run the model in fp32 (default), bf16 or fp16; gradient and relevance sums stay float32 (see docs/models.md for each method's difference from fp32).")] = "fp32",
    generate: Annotated[int | None, typer.Option("--generate", "-g", help="Language models: generate N tokens and explain each one.")] = None,
    continuation: Annotated[str | None, typer.Option("--continuation", help="Language models: explain this given continuation, token by token.")] = None,
    quantity: Annotated[str | None, typer.Option("--quantity", help="Explain the target's logit or log_prob (generation and spans: log_prob).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="With --generate / --continuation: the texts are user messages in the model's chat template.")] = False,
    sources: Annotated[str | None, typer.Option("--sources", help="Cut each text into sources and rank them: sentences, paragraphs or tokens:N. --file is then one document.")] = None,
    query: Annotated[str | None, typer.Option("--query", help="With --sources: text appended after each document (e.g. the question), not itself a source.")] = None,
    chat_file: Annotated[str | None, typer.Option("--chat-file", help='A conversation as JSON, [{"role": ..., "content": ...}, ...], in the model\'s chat template; its messages are the sources (--sources messages).')] = None,
    max_memory: Annotated[str | None, typer.Option("--max-memory", help="Memory one pass may use, e.g. 4GB or 512MiB (default: half of the free memory).")] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub ids: the branch, tag or commit to load (or --model ORG/NAME@REV).")] = None,
    allow_pickle: Annotated[bool, typer.Option("--allow-pickle", help="Hub ids: load pickled weights when a repository has no safetensors (unpickling runs code).")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Run a repository's own model code (auto_map), as transformers does.")] = False,
    sinks: Annotated[bool, typer.Option("--sinks/--no-sinks", help="Leave the first token (an attention sink in many decoders) out of the colour scale, as the special tokens; the scores are unchanged.")] = True,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse an --option precision=... this machine runs slower than fp32 (default: run it with a warning).")] = False,
) -> None:
    """Explain TEXT(s) with one or more methods and show a heatmap (or JSON / HTML); with
    --generate or --continuation, explain every token a language model writes after them; with
    --sources, rank the sources of a long text for the target, or for the answer the model
    writes with --generate N (the context methods: source_loo, context_cite -- the default --
    and hierarchical; any other method's scores pooled per source)."""
    import heedful
    from heedful.engine.precision import check_dtype, strict_precision
    from heedful.loading import check_device
    from heedful.render.html import explanation_page
    from heedful.render.terminal import print_explanations

    check_device(device)
    check_dtype(dtype)
    if html is not None:
        check_writable(html, "--html")  # before any work, so that none is lost
    if seed is not None and seed < 0:
        raise HeedfulError(f"--seed must be 0 or more, got {seed}", hint="e.g. --seed 0")
    budget = None if max_memory is None else parse_memory(max_memory)
    hub = {k: v for k, v in {"revision": revision, "allow_pickle": allow_pickle, "trust_remote_code": trust_remote_code}.items() if v}
    if dtype != "fp32":
        hub["dtype"] = dtype
    if chat_file is not None:
        if texts or file is not None or query is not None or sources not in (None, "messages") or continuation is not None:
            raise HeedfulError("--chat-file is the whole input, its messages the sources", hint="drop TEXT, --file, --query, --continuation and --sources")
        items, sources = [_read_conversation(chat_file)], "messages"
    else:
        items = _read_document(texts or [], file) if sources is not None else _read_texts(texts or [], file)
    if query is not None and sources is None:
        raise HeedfulError("--query goes with --sources", hint="add --sources sentences (or paragraphs, tokens:N)")
    spans = None
    if sources == "messages":
        if chat_file is None:
            raise HeedfulError("--sources messages needs a conversation", hint="give it with --chat-file conversation.json")
        spec = sources
    elif sources is not None:
        spec = heedful.SourceSpec.parse(sources)
        if query is not None:
            spans = [heedful.SourceSpec.parse(spec, within=(0, len(text))) for text in items]
            items = [f"{text}\n\n{query}" for text in items]
    default = "context_cite" if sources is not None else "saliency" if generate or continuation else "normxlogit"
    infos = [heedful.get_method(name) for name in method or [default]]
    runs = _method_options(infos, options(option, "--option n_steps=100"), seed, layerwise)
    if quantity is not None and quantity not in heedful.QUANTITIES:
        raise HeedfulError(f"--quantity must be one of {', '.join(heedful.QUANTITIES)}, got {quantity!r}")
    if sources is not None and generate is not None:
        if target is not None or continuation is not None:
            raise HeedfulError("--generate writes the answer whose sources are ranked", hint="drop --target / --continuation, or --generate")
        if generate < 1:
            raise HeedfulError(f"--generate must be at least 1, got {generate}")
        loaded = load_model(model, device, budget, **hub)
        answers = _answers(loaded, items, generate)
    elif generate is not None or continuation is not None:
        if sources is not None:
            raise HeedfulError("--continuation with --sources: give the answer as --target", hint="--target ' the answer'")
        if target is not None:
            raise HeedfulError("--target does not apply to --generate / --continuation", hint="each generated token is its own target")
        if generate is not None and generate < 1:
            raise HeedfulError(f"--generate must be at least 1, got {generate}")
        loaded = load_model(model, device, budget, **hub)
        works = [
            loaded.estimate_generation(items, info.name, max_new_tokens=generate or 20, continuation=continuation, chat=chat, **kwargs)
            for info, kwargs in zip(infos, runs, strict=True)
        ]
        announce(functools.reduce(operator.add, [works[0], *(w.explaining() for w in works[1:])]))
        with strict_precision(strict):
            _explain_generation(loaded, items, infos, runs, generate, continuation, quantity, chat, as_json, html)
        return
    else:
        answers = None
        loaded = load_model(model, device, budget, **hub)
        if loaded.task == "seq2seq_lm" and target is None:
            raise HeedfulError(
                "an encoder–decoder model is explained for an output sequence, and none was given",
                hint="give it: --continuation 'the output' (teacher-forced), --generate N, or --target 'the output'",
            )
    announce(
        functools.reduce(
            operator.add,
            [loaded.estimate(items, info.name, truncation=not no_truncate, **kwargs) for info, kwargs in zip(infos, runs, strict=True)],
        )
    )
    results: list[heedful.Explanation] = []
    show_bar = len(items) > batch_size
    with strict_precision(strict), progress() as bar:
        for info, kwargs in zip(infos, runs, strict=True):
            task_id = bar.add_task(info.name, total=len(items), visible=show_bar)
            if spans is not None or answers is not None:  # each document has its own region or answer
                found = [
                    loaded.explain(
                        text, info.name, target if answers is None else answers[i], truncation=not no_truncate,
                        quantity=quantity, sources=spec if spans is None else spans[i], **kwargs,
                    )
                    for i, text in enumerate(items)
                ]
                bar.advance(task_id, len(items))
            else:
                found = loaded.explain(
                    items,
                    info.name,
                    target,
                    batch_size=batch_size,
                    truncation=not no_truncate,
                    progress=lambda n, t=task_id: bar.advance(t, n),
                    quantity=quantity,
                    sources=None if sources is None else spec,
                    **kwargs,
                )
            results.extend(found)
    ordered = _by_text(results, len(items), len(infos))
    if html is not None:
        html.write_text(explanation_page(ordered, words=words, sinks=sinks), encoding="utf-8")
        err.print(f"wrote {html}", markup=False, highlight=False)
    if as_json:
        payload = [_json_view(e, words) for e in ordered]
        out.print_json(json.dumps(payload[0] if len(payload) == 1 else payload))
    elif html is None or sys.stdout.isatty():
        print_explanations(ordered, words=words, console=out, sinks=sinks)


def _read_conversation(path: str) -> list[dict[str, str]]:
    """The messages of the JSON file ``path`` (a list of ``{"role", "content"}``), or one line
    saying what is wrong with it (the messages themselves are checked when they are templated)."""
    text = read_text_file(path, "--chat-file")
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise HeedfulError(f"--chat-file {path} is not JSON ({exc})", hint='give [{"role": "user", "content": "..."}, ...]') from None
    if not isinstance(found, list) or not found or not all(isinstance(m, dict) and "role" in m for m in found):
        raise HeedfulError(
            f"--chat-file {path} is not a list of messages",
            hint='give [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}, ...]',
        )
    return found


def _answers(loaded, items: list, steps: int) -> list[str]:
    """What the model writes after each text (greedy, at most ``steps`` tokens, up to its end of
    sequence): the span target whose sources --sources ranks."""
    generation = loaded.generate(items, steps)
    eos = getattr(loaded.tokenizer, "eos_token_id", None)
    found = []
    for ids in generation.continuations:
        kept = ids[: ids.index(eos)] if eos in ids else ids
        text = loaded.tokenizer.decode(kept)
        if not text.strip():
            raise HeedfulError("the model wrote nothing but the end of the text", hint="give the answer as --target")
        found.append(text)
    return found


def _by_text(found: list, texts: int, methods: int) -> list:
    """Method-major results (every text for method 1, then method 2, ...) reordered so each
    text's methods sit together."""
    return [found[m * texts + i] for i in range(texts) for m in range(methods)]


def _explain_generation(loaded, items, infos, runs, generate, continuation, quantity, chat, as_json, html) -> None:
    """Generate (or force) a continuation of every text once, explain each of its tokens with
    every method, and show the step x token matrices (or JSON / HTML)."""
    from heedful.render.generation import generation_page

    generation = loaded.generate(items, generate or 20, continuation=continuation, chat=chat)
    found = []
    for info, kwargs in zip(infos, runs, strict=True):
        found.extend(loaded.explain_generation(generation, info.name, quantity=quantity, **kwargs))
    ordered = _by_text(found, len(items), len(infos))
    if html is not None:
        html.write_text(generation_page(ordered), encoding="utf-8")
        err.print(f"wrote {html}", markup=False, highlight=False)
    if as_json:
        payload = [g.to_dict() for g in ordered]
        out.print_json(json.dumps(payload[0] if len(payload) == 1 else payload))
    elif html is None or sys.stdout.isatty():
        for g in ordered:
            out.print(g)


def _method_options(infos, extra: dict[str, Any], seed: int | None, layerwise: bool) -> list[dict[str, Any]]:
    """Every method's options from ``--option`` (each method gets the ones it takes), ``--seed``
    (stochastic methods) and ``--layerwise``, validated before the model is loaded. An option no
    method takes is an error, as is ``--layerwise`` for a method without layer-wise scores."""
    unused = sorted(k for k in extra if not any(info.takes(k) for info in infos))
    if unused:
        who = infos[0].name if len(infos) == 1 else "none of " + ", ".join(info.name for info in infos)
        raise HeedfulError(
            f"{who} {'does not take' if len(infos) == 1 else 'takes'} the option(s) {', '.join(unused)}",
            hint=did_you_mean(
                unused[0], sorted({o.name for info in infos for o in info.options}), "option",
                listing="see `heedful methods METHOD` for a method's options",
            ),
        )
    found = []
    for info in infos:
        kwargs = {k: v for k, v in extra.items() if info.takes(k)}
        if seed is not None and info.stochastic:
            kwargs["seed"] = seed
        if layerwise:
            if not info.layerwise:
                raise HeedfulError(f"{info.name} has no layer-wise scores", hint="drop --layerwise")
            kwargs["layerwise"] = True
        info.bind(kwargs)  # wrong types and values fail here, before any work
        found.append(kwargs)
    return found


def _json_view(expl, words: bool) -> dict[str, Any]:
    data = expl.to_dict()
    if words:
        data["words"] = expl.words("sum").to_dict()
    if expl.sources is not None:
        data["source_scores"] = expl.source_scores().to_dict()
    return data


WIDE_METHODS_TABLE = 160
"""Terminal columns from which ``heedful methods`` shows each method's source in its table."""


@app.command()
def methods(
    name: Annotated[str | None, typer.Argument(help="Show this method's options.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table as markdown (the README's).")] = False,
    write: Annotated[Path | None, typer.Option("--write", help="With --markdown: put the table into this file (README.md) between its <!-- methods: ... --> and <!-- /methods --> lines.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Which methods apply to this model (zoo name or folder), and why the others do not.")] = None,
) -> None:
    """List the attribution methods with their family, tasks, cost and source; with NAME, that
    method's options (defaults, choices, ranges); with --model, the methods that model allows;
    with --markdown --write README.md, the README's table rewritten from the registry."""
    from heedful.catalog import entries
    from heedful.render.methods import method_table

    if model is not None:
        import heedful

        _model_methods(heedful.load(model))
        return
    catalog = entries()  # the registry's table without importing torch
    if name is not None:
        info = catalog.find(name)
        table = Table(title=f"{info.name}: {escape(info.summary)}", caption=escape(info.citation))
        for col in ("option", "default", "accepts"):
            table.add_column(col, overflow="fold")
        for spec in info.options:
            table.add_row(spec.name, escape(spec.default), escape(spec.accepts) + (" (runtime)" if spec.runtime else ""))
        out.print(table)
        return
    if write is not None and not markdown:
        raise InputError("--write writes the markdown table", hint="add --markdown: heedful methods --markdown --write README.md")
    if markdown:
        if write is not None:
            from heedful.catalog import from_registry
            from heedful.commands.method_table import write_method_table

            # the live registry, not the generated catalog, which may not be regenerated yet
            write_method_table(write, method_table(from_registry().methods))
            return
        print(method_table(catalog.methods))
        return
    from heedful import frontier

    fronts = {task: frontier.front(task) for task in catalog.tasks}
    measured = [f"{task} ({frontier.measured_on(task)})" for task, names in fronts.items() if names]
    caption = f"front: on the faithfulness-cost front of {'; '.join(measured)} -- docs/results/frontier.md" if measured else None
    # a source column folded into a narrow terminal is a letter per line: there, NAME shows it
    sources = out.width >= WIDE_METHODS_TABLE
    if not sources:
        caption = "\n".join(c for c in (caption, "heedful methods NAME: a method's source and options") if c)
    table = Table(title="heedful methods", caption=caption, box=None if not sources else box.HEAVY_HEAD, pad_edge=False)
    table.add_column("method", no_wrap=True, style="bold")
    table.add_column("family", no_wrap=True)
    table.add_column("tasks", overflow="fold", max_width=16)
    table.add_column("cost per example", ratio=1, min_width=16)
    if sources:
        table.add_column("source", ratio=1)
    table.add_column("front", no_wrap=True, min_width=5)
    for info in catalog.methods:
        tasks = "all" if set(info.tasks) == set(catalog.tasks) else ", ".join(info.tasks)
        on = "; ".join(task if marks == [""] else f"{task} ({'; '.join(m or 'defaults' for m in marks)})"
                       for task in fronts for marks in [frontier.front_marks(task, info.name)] if marks)
        cells = (info.name, info.family, tasks, escape(info.cost), *((escape(info.citation),) if sources else ()))
        table.add_row(*cells, ("★" if len(measured) == 1 and not sources else f"★ {on}") if on else "")
    out.print(table)


def _model_methods(model) -> None:
    """The table of ``heedful methods --model``: every method of the model's task, whether it
    runs on the model and, when not, what the model does not give it."""
    from heedful.adapters.needs import EXTENDING, NEEDS
    from heedful.attribution import methods as registered_methods

    found = model.methods()
    runs = sum(not missing for missing in found.values())
    table = Table(
        title=f"methods for {escape(model.name)}: {runs} of {len(found)} run on {escape(model.adapter.described)}",
        caption=f"a family is given what a method needs in {EXTENDING}" if runs < len(found) else None,
    )
    table.add_column("method", no_wrap=True, style="bold")
    for col in ("family", "runs", "why not"):
        table.add_column(col, overflow="fold")
    for info in registered_methods(task=model.task):
        missing = found[info.name]
        why = "; ".join(f"needs {NEEDS[n]}" for n in missing)
        table.add_row(info.name, info.family, "no" if missing else "yes", escape(why))
    out.print(table)


@models_app.callback()
def models_list(
    ctx: typer.Context,
    sources: Annotated[bool, typer.Option("--sources", help="List every pinned download instead: version, sha256, source URL, and whether the cached copy is verified.")] = False,
    families: Annotated[bool, typer.Option("--families", help="List the model families heedful maps instead, and the method families each gets.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="With --families: print the table of docs/models.md.")] = False,
) -> None:
    """List zoo models: built or not, size, held-out score."""
    if ctx.invoked_subcommand is not None:
        return
    if families:
        from heedful.commands.families import COLUMNS, families_markdown, family_rows

        if markdown:
            print(families_markdown(), end="")
            return
        table = Table(title="model families")
        for col in COLUMNS:
            table.add_column(col, overflow="fold")
        for row in family_rows():
            table.add_row(*row)
        out.print(table)
        return
    if sources:
        from heedful.commands.supply import show_sources

        show_sources()
        return
    from heedful import zoo
    from heedful.files.cache import heedful_home

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
    from_scratch: Annotated[
        bool,
        typer.Option("--from-scratch", help="Train a model that is otherwise assembled from weights shipped with heedful (minutes, same seed)."),
    ] = False,
) -> None:
    """Build (train or convert) a zoo model into the cache."""
    from heedful import zoo

    path = zoo.build(name, force=force, progress=True, from_scratch=from_scratch)
    out.print(f"built {name} -> {path}")


# ---------------------------------------------------------------- further commands
# One line per command module in heedful/commands (keep heavy imports inside the commands).
app.add_typer(bench_command.app, name="bench")
app.add_typer(at2_command.app, name="at2")
app.add_typer(interest_command.app, name="interest")
app.command("heads")(heads_command.heads)
app.command("info")(info_command.info)
app.command("probe")(probe_command.probe)
app.command("reproduce")(reproduce_command.reproduce)
app.command("rectify")(rectify_command.rectify)
app.command("steer")(steer_command.steer)
app.command("trace")(trace_command.trace)
app.command("counterfactual")(counterfactual_command.counterfactual)
app.command("serve")(serve_command.serve)
app.command("warm")(warm_command.warm)


def main() -> None:
    """Entry point: user errors -- heedful's own, the command line's usage errors and files
    the system refuses -- print as one ``error:`` line and a ``hint:`` line, exit code 2."""
    try:
        from typer._click import exceptions as click  # typer vendors its own click
    except ImportError:  # pragma: no cover  (older typer: click itself)
        from click import exceptions as click

    from heedful.progress import reporting
    from heedful.render.progress import MODES

    mode = os.environ.get("HEEDFUL_PROGRESS", "auto")
    if mode not in MODES:
        print_error(f"HEEDFUL_PROGRESS must be one of {', '.join(MODES)}, got {mode!r}", "unset it, or use --quiet / --progress")
        raise SystemExit(2)
    bars.configure(mode)
    sys.argv[1:] = _progress_flags_first(sys.argv[1:])
    with warnings.catch_warnings(record=True) as caught, reporting(bars), noticing() as interrupts:
        warnings.simplefilter("always")
        try:
            code = app(standalone_mode=False)
        except HeedfulError as exc:
            _fail(caught, exc.message, exc.cli_hint or f"see `{_command_path()} --help`")
        except click.NoArgsIsHelpError as exc:
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx is not None else "heedful"
            _fail(caught, exc.format_message(), f"see `{command} --help`")
        except click.ClickException as exc:
            _fail(caught, exc.format_message(), None)
        except sqlite3.OperationalError as exc:  # a results store locked or made read-only during the run
            _fail(caught, f"results store: {exc}", "what was computed before is kept in the store; rerun to resume")
        except OSError as exc:  # a file or folder the system refuses, met during the work
            where = f" {exc.filename}" if exc.filename else ""
            _fail(caught, f"{exc.strerror or exc}{where}", "check the path and its permissions")
        except (KeyboardInterrupt, typer.Abort):
            interrupts.say()
            raise SystemExit(130) from None
        except Exception:
            if not interrupts.received:
                raise
            # the interrupt, wrapped: Python 3.11 turns a KeyboardInterrupt raised while a class
            # is made (a dataclass field's __set_name__, mid-import) into a RuntimeError
            interrupts.say()
            raise SystemExit(130) from None
        finally:
            _flush_warnings(caught)
    if code == 130 and interrupts.received:  # typer turned the KeyboardInterrupt into a bare exit code
        interrupts.say()
    if isinstance(code, int) and code:
        raise SystemExit(code)


def _progress_flags_first(args: list[str]) -> list[str]:
    """``args`` with ``--quiet`` / ``--progress`` moved to the front, where the command line's
    own options are parsed, so that ``heedful interest layers TEXT --quiet`` works as users type
    it (up to a ``--``, after which everything is an argument)."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in PROGRESS_FLAGS]
    return flags + [a for a in args[:end] if a not in PROGRESS_FLAGS] + args[end:]


def _command_path() -> str:
    """``heedful`` and the (sub)command named on the command line, for a help hint."""
    words, group = ["heedful"], typer.main.get_command(app)
    for arg in sys.argv[1:3]:
        found = getattr(group, "commands", {}).get(arg)
        if found is None:
            break
        words.append(arg)
        group = found
    return " ".join(words)


def _fail(caught: list, message: str, hint: str | None) -> None:
    _flush_warnings(caught)
    print_error(message, hint)
    raise SystemExit(2) from None


def _flush_warnings(caught: list) -> None:
    for w in caught:
        if "truncated" in str(w.message) or f"{Path('heedful')}" in str(w.filename):
            err.print(Text.assemble(("warning: ", "yellow"), str(w.message)), highlight=False)
    caught.clear()


if __name__ == "__main__":  # pragma: no cover
    main()
