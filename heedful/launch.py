"""The ``heedful`` entry point: a command line goes to this checkout's warm worker when one runs
(:mod:`heedful.worker`; the answer in tens of milliseconds instead of seconds of imports), else
it runs in this process (:func:`heedful.cli.main`). Standard library only until then.

Commands that load a model (:data:`STARTS_WORKER`) run on a terminal also start a worker in the
background for the commands that follow; it exits after ``HEEDFUL_WARM_IDLE`` minutes without
a command (15). ``HEEDFUL_WARM=never`` or ``--no-warm`` runs every command in its own process
and starts none; ``HEEDFUL_WARM=always`` starts one also where stderr is no terminal. A command
that reads stdin (an argument ``-``), ``heedful serve`` and ``heedful warm`` itself always run
here.
"""

from __future__ import annotations

import os
import sys

MODES = ("auto", "always", "never")
LOCAL = {"serve", "warm"}
"""Commands never sent to the worker: a server of its own, and the worker's own control."""
STARTS_WORKER = {"explain", "trace", "heads", "probe", "counterfactual", "steer", "rectify", "interest", "info"}
"""Commands that load a model, after which a worker is worth keeping."""
OPTIONS = {"--quiet", "--progress", "--no-warm"}
"""The command line's own options, which may stand before the command."""


def command_of(args: list[str]) -> str | None:
    """The command ``args`` names (``None``: none, as for ``heedful --help``)."""
    for arg in args:
        if arg == "--" or arg not in OPTIONS:
            return None if arg.startswith("-") else arg
    return None


def main() -> None:
    # as heedful.cli sets it, before the worker's key reads the environment (see there why)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = sys.argv[1:]
    mode = os.environ.get("HEEDFUL_WARM", "auto")
    if mode not in MODES:
        print(f"error: HEEDFUL_WARM must be one of {', '.join(MODES)}, got {mode!r}", file=sys.stderr)
        print("hint: unset it, or pass --no-warm", file=sys.stderr)
        raise SystemExit(2)
    before_end = args[: args.index("--")] if "--" in args else args
    command = command_of(args)
    files = None
    if mode != "never" and "--no-warm" not in before_end and command is not None and command not in LOCAL and "-" not in before_end:
        code, files = _through_worker(args, command, mode)
        if code is not None:
            raise SystemExit(code)
    from heedful.cli import main as in_process

    try:
        in_process()
    finally:
        stopped = sys.exc_info()[1]
        if files is not None and not (isinstance(stopped, KeyboardInterrupt) or getattr(stopped, "code", None) == 130):
            _start(files)  # after the command, so that its imports do not share the cores with the worker's


def _through_worker(args: list[str], command: str, mode: str) -> tuple[int | None, dict | None]:
    """The exit code of ``args`` run by the warm worker (``None``: run it here), and the files of
    a worker to start after it when none runs and ``command`` loads a model (or the running one
    runs other code)."""
    from heedful.warm import channel, client

    if not channel.available():
        return None, None
    try:
        files = channel.paths(channel.ensure_private(channel.run_dir()))
    except (OSError, channel.Unsafe):
        return None, None
    code = client.run(args, files)
    if isinstance(code, int):
        return code, None
    wanted = code == client.REFUSED or (command in STARTS_WORKER and (mode == "always" or sys.stderr.isatty()))
    return None, files if wanted else None


def _start(files: dict) -> None:
    """Start a worker in the background, saying so on a terminal."""
    from heedful.warm import client

    try:
        client.start(files=files)
    except OSError:
        return
    if sys.stderr.isatty():
        print("started a warm worker for the next commands (heedful warm --status / --stop; --no-warm)", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    main()
