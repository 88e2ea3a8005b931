"""``heedful warm``: start, ask about and stop the warm worker (:mod:`heedful.worker`), which
keeps torch, transformers and the loaded models in memory for the commands that follow.

Registered in :mod:`heedful.cli`; run in its own process, never sent to a worker
(:mod:`heedful.launch`).
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from rich.markup import escape

from heedful.commands.console import err, out
from heedful.errors import InputError


def warm(
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Load this model into the worker now (repeat).")] = None,
    idle: Annotated[float | None, typer.Option("--idle", help="Minutes without a command after which the worker exits (default 15, or HEEDFUL_WARM_IDLE).")] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the worker (also in the middle of a command).")] = False,
    status: Annotated[bool, typer.Option("--status", help="Say whether a worker runs, since when, and which models it holds.")] = False,
) -> None:
    """Start a warm worker: a background process of this user that holds torch, transformers and
    the models it loaded, so that the next commands (`heedful explain ...`) start at once. The
    commands go to it by themselves, print exactly what they would print on their own, and
    their Ctrl-C reaches it; it listens on a socket only this user may use and exits after
    --idle minutes without a command. A command that loads a model on a terminal starts one
    too; HEEDFUL_WARM=never or --no-warm runs every command in its own process."""
    from heedful.warm import channel, client

    if not channel.available():
        raise InputError("a warm worker needs Unix sockets, which this system lacks", hint="run the commands as they are")
    if stop and status:
        raise InputError("--stop and --status contradict each other", hint="give one of them")
    if idle is None and "HEEDFUL_WARM_IDLE" in os.environ:
        try:
            idle = float(os.environ["HEEDFUL_WARM_IDLE"])
        except ValueError:
            raise InputError(f"HEEDFUL_WARM_IDLE must be a number of minutes, got {os.environ['HEEDFUL_WARM_IDLE']!r}", hint="e.g. HEEDFUL_WARM_IDLE=15, or unset it") from None
    if idle is not None and not idle > 0:
        raise InputError(f"--idle must be more than 0 minutes, got {idle:g}", hint="e.g. --idle 15")
    files = channel.paths(channel.ensure_private(channel.run_dir()))
    if stop:
        pid = client.stop(files)
        out.print("no warm worker runs" if pid is None else f"stopped the warm worker (pid {pid})", highlight=False)
        return
    if status:
        _show(client.ask(files), files)
        return
    if os.environ.get("HEEDFUL_WARM") == "never":
        raise InputError("HEEDFUL_WARM=never: no command would use the worker", hint="unset HEEDFUL_WARM first")
    state = client.ask(files)
    if state is not None and (state["key"] != channel.code_key() or (idle is not None and idle != state["idle_minutes"])):
        client.stop(files)  # other code, or another timeout: a fresh one
        state = None
    if state is None:
        if client.running_pid(files) is not None:  # running, yet silent: busy with a command
            raise InputError("the warm worker is busy with a command", hint="wait for it, or stop it with heedful warm --stop")
        began = time.monotonic()
        with err.status("starting the warm worker (imports torch and transformers) …"):
            state = client.wait_ready(client.start(idle, files), files)
        if state is None:
            raise InputError(f"the warm worker did not start; its log is {files['log']}", hint="run the commands with --no-warm")
        err.print(f"started in {time.monotonic() - began:.1f} s", highlight=False)
    if model:
        with err.status(f"loading {', '.join(model)} …"):
            state = client.ask(files, timeout=3600.0, load=list(model)) or state
        for name, problem in state.get("failed", {}).items():
            err.print(f"[yellow]warning:[/] {escape(name)} was not loaded: {escape(problem)}", soft_wrap=True, highlight=False)
    _show(state, files)


def _show(state: dict | None, files: dict) -> None:
    if state is None:
        out.print("no warm worker runs (or it is busy with a command)", highlight=False)
        return
    since = time.strftime("%H:%M:%S", time.localtime(state["since"]))
    models = ", ".join(state["models"]) or "none yet"
    out.print(
        f"warm worker pid {state['pid']} since {since}: {state['jobs']} command(s) run, models {models}; "
        f"exits after {state['idle_minutes']:g} min idle; socket {state['socket']}",
        highlight=False, soft_wrap=True,
    )
