"""What every command shares: the two consoles, the progress bars, and loading a model with a
spinner."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from heedful.render.progress import Bars

out = Console()
"""Results (tables, heatmaps, JSON) go to stdout."""
err = Console(stderr=True)
"""Status, progress, warnings and errors go to stderr."""


bars = Bars(err)
"""The one progress display of a command (on stderr): the command's own bars and every task
the library reports (:mod:`heedful.progress`; :func:`heedful.cli.main` installs it). On a
terminal by default; ``--quiet`` or ``HEEDFUL_PROGRESS=never`` silence it, ``--progress`` or
``HEEDFUL_PROGRESS=always`` log its lines where stderr is no terminal (CI, ``nohup``)."""


def progress() -> Bars:
    """The command's progress display, to open with ``with`` and add bars to."""
    return bars


def announce(work, what: str | None = None) -> None:
    """Say on stderr how long ``work`` (a :class:`heedful.engine.workload.Work`; ``what``: the part of
    the run it covers) is expected to take, when that is long
    (:data:`heedful.engine.workload.LONG_SECONDS`), before it starts."""
    if work.long:
        part = f"{what}: " if what else ""
        err.print(f"{part}{work.describe()} (estimated on this machine)", markup=False, highlight=False, soft_wrap=True)


def load_model(name: str, device: str = "cpu", max_memory: int | str | None = None, **hub):
    """:func:`heedful.load` with a spinner on stderr (zoo models are built on first use, hub ids
    downloaded with their own progress bars); ``max_memory``: the budget of one pass (see
    :mod:`heedful.engine.memory`); ``hub``: ``revision``, ``allow_pickle``, ``trust_remote_code``, ``dtype``."""
    import heedful

    key = None if kept_models is None else (name, device, max_memory, tuple(sorted(hub.items())), _stamp(name))
    if kept_models is not None and key in kept_models:
        kept_models[key] = kept_models.pop(key)  # the most recently used last
        return kept_models[key]
    with err.status(f"loading {name} …"):
        model = heedful.load(name, device=device, max_memory=max_memory, **hub)
    if kept_models is not None:
        kept_models[key] = model
        while len(kept_models) > KEEP_MODELS:
            kept_models.pop(next(iter(kept_models)))
    return model


kept_models: dict | None = None
"""Loaded models kept across commands by :func:`load_model`, in the warm worker
(:mod:`heedful.worker`) only: by their arguments and the files' modification times."""
KEEP_MODELS = 2


def _stamp(name: str) -> tuple:
    """The modification times of the files of the model folder ``name`` (a path or a built zoo
    model): a model rebuilt or saved again is loaded again."""
    from heedful.files.cache import heedful_home

    for folder in (Path(name).expanduser(), heedful_home() / "models" / name):
        try:
            if folder.is_dir():
                return tuple(sorted((f.name, f.stat().st_mtime_ns) for f in folder.iterdir()))
        except (OSError, ValueError):
            continue
    return ()


def read_text_file(path: str, what: str = "--file") -> str:
    """The whole of the UTF-8 text file ``path`` (``"-"``: stdin), or a one-line
    :class:`HeedfulError` naming what is wrong with it: missing, a directory, unreadable,
    binary or not UTF-8."""
    import sys

    from heedful.errors import HeedfulError

    if path == "-":
        return sys.stdin.read()
    file = Path(path).expanduser()
    if not file.exists():
        raise HeedfulError(f"{what} {path} does not exist", hint="give the path of a UTF-8 text file (or - for stdin)")
    if file.is_dir():
        raise HeedfulError(f"{what} {path} is a directory", hint="give the path of a UTF-8 text file, one text per line")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise HeedfulError(f"{what} {path} cannot be read ({exc.strerror})", hint="check its permissions") from None
    if b"\x00" in data:
        raise HeedfulError(f"{what} {path} is a binary file, not text", hint="give a UTF-8 text file, one text per line")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HeedfulError(
            f"{what} {path} is not UTF-8 text (byte {exc.start})",
            hint="convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None


def check_writable(path: Path, what: str, folder: bool = False) -> None:
    """Refuse, before any work, an output ``path`` that cannot be written: its folder missing
    or read-only, or the path itself of the wrong kind (a directory where a file goes, a file
    where a folder goes). ``folder``: the path is a folder that is created if missing."""
    import os
    import tempfile

    from heedful.errors import HeedfulError

    path = Path(path).expanduser()
    if folder:
        if path.exists() and not path.is_dir():
            raise HeedfulError(f"{what} {path} is a file, not a folder", hint=f"give {what} a folder path")
        existing = path
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise HeedfulError(f"{what} {path} lies under the file {existing}", hint=f"give {what} a folder path")
    else:
        if path.is_dir():
            raise HeedfulError(f"{what} {path} is a directory", hint=f"give {what} a file path, e.g. {path / 'out.html'}")
        existing = path.parent if str(path.parent) else Path(".")
        if not existing.is_dir():
            raise HeedfulError(
                f"the folder of {what} {path} does not exist", hint=f"create it first (mkdir -p {existing}) or pick another path"
            )
        if path.exists() and not os.access(path, os.W_OK):
            raise HeedfulError(f"{what} {path} is not writable", hint="pick another path or change its permissions")
    try:  # a real write: permission bits say nothing for root, nor for read-only mounts
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".heedful-write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise HeedfulError(f"{what} {path}: cannot write in {existing} ({exc.strerror})", hint="pick a folder you can write to") from None


def print_error(message: str, hint: str | None = None) -> None:
    """A user error on stderr: one ``error:`` line (never wrapped, never read as markup) and
    an optional ``hint:`` line."""
    from rich.text import Text

    for label, style, text in (("error: ", "bold red", message), ("hint: ", "dim", hint)):
        if text:
            line = " ".join(str(text).split())  # one line, whatever the message holds
            line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)  # no control codes, no lone surrogates
            err.print(Text.assemble((label, style), line), soft_wrap=True, highlight=False)
