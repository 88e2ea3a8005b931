"""Signs of life from long computations: the library reports the steps of named tasks, the
application that runs it shows them.

Code that may run for more than a couple of seconds wraps its loop in :func:`task` and
advances it per step (an ablation chunk, a solver step, a sweep point, an example)::

    with task("context_cite ablations", total=n) as steps:
        for chunk in chunks:
            ...
            steps.advance(len(chunk))

Nothing is shown unless a :class:`Reporter` is installed with :func:`reporting` for the
current context (a :class:`~contextvars.ContextVar`, so threads and async jobs each see their
own): the command line installs rich bars on stderr (:class:`heedful.render.progress.Bars`);
a library caller may install its own (a logger, a notebook widget, a web page's server-sent
events) or :func:`heedful.render.progress.show_progress` for the same bars in a script.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol


class Reporter(Protocol):
    """What shows progress: a task starts (``total`` steps, ``None`` when unknown), advances and
    ends; ``start`` returns the handle the other two receive."""

    def start(self, description: str, total: float | None) -> Any: ...

    def advance(self, handle: Any, steps: float) -> None: ...

    def finish(self, handle: Any) -> None: ...


_REPORTER: ContextVar[Reporter | None] = ContextVar("heedful_progress", default=None)


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Tasks started inside the block report to ``reporter`` (``None``: to nobody)."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)


def current() -> Reporter | None:
    """The reporter tasks started here report to (``None``: nobody)."""
    return _REPORTER.get()


class Task:
    """A running task; :meth:`advance` it by the steps done."""

    __slots__ = ("_reporter", "_handle")

    def __init__(self, reporter: Reporter | None, handle: Any) -> None:
        self._reporter, self._handle = reporter, handle

    def advance(self, steps: float = 1) -> None:
        if self._reporter is not None:
            self._reporter.advance(self._handle, steps)


@contextmanager
def task(description: str, total: float | None, *, shown: bool = True) -> Iterator[Task]:
    """A task of ``total`` steps reported to the current :class:`Reporter` (if any) while the
    block runs; the reporter hears its end even when the block raises. ``shown=False``: not
    reported (a task known to be short, e.g. a single chunk)."""
    reporter = _REPORTER.get()
    if reporter is None or not shown:
        yield Task(None, None)
        return
    handle = reporter.start(description, total)
    try:
        yield Task(reporter, handle)
    finally:
        reporter.finish(handle)
