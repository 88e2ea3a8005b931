"""Ctrl-C on the command line: every command stops with one line on stderr and exit code 130.

typer turns a ``KeyboardInterrupt`` raised inside a command into a bare exit code 130, so a
command stopped by Ctrl-C used to exit without a word. :func:`noticing` records that SIGINT
arrived (its handler raises ``KeyboardInterrupt`` as Python's own does), so that
:func:`heedful.cli.main` can tell an interrupt from a command's own exit 130 and say so once: a
command that reports what it kept (``heedful bench``) says it with :func:`say_interrupted`
first, and the generic line is not repeated.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from heedful.commands.console import err

STOPPED = "interrupted (Ctrl-C): stopped before the end; nothing more was written"


@dataclass
class Interrupts:
    """What one run of the command line saw: whether SIGINT arrived, whether it was reported."""

    received: bool = False
    said: bool = False

    def say(self, message: str | None = None) -> None:
        """Print ``message`` (default :data:`STOPPED`) on stderr, once per run."""
        if not self.said:
            self.said = True
            err.print(message or STOPPED, style="yellow", highlight=False, markup=False, soft_wrap=True)


_current = Interrupts()


@contextmanager
def noticing() -> Iterator[Interrupts]:
    """Record SIGINT inside the block (the handler then raises ``KeyboardInterrupt`` as Python's
    default does). A process that ignores SIGINT, or whose handler is someone else's, keeps it;
    outside the main thread nothing is installed."""
    global _current
    _current = state = Interrupts()
    installed = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def received(signum, frame):
        state.received = True
        signal.default_int_handler(signum, frame)

    if installed:
        signal.signal(signal.SIGINT, received)
    try:
        yield state
    finally:
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def say_interrupted(message: str | None = None) -> None:
    """Report the interrupt of this run (``message``: what was kept and how to resume)."""
    _current.say(message)
