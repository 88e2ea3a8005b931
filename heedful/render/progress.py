"""Progress bars: one rich display for every long job heedful runs (explaining, benchmarking,
building models), which also logs a line at every tenth of a task when stderr is no terminal;
:class:`Bars` shows the tasks the library reports through :mod:`heedful.progress`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class LoggedProgress(Progress):
    """A rich :class:`~rich.progress.Progress` that also prints a line at every tenth of a task
    when not on a terminal: a live bar is invisible in a log file (CI, ``nohup``) until it ends,
    and these lines show that a long job is moving."""

    def __init__(self, *columns: object, **kwargs: object) -> None:
        super().__init__(*columns, **kwargs)
        self._logged_tenths: dict[int, int] = {}

    def update(self, task_id, **kwargs) -> None:  # type: ignore[override]
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id) -> None:
        if self.disable or self.console.is_terminal:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        if not task.total:
            return
        tenths = int(10 * task.completed / task.total)
        if tenths > self._logged_tenths.get(task_id, 0):
            self._logged_tenths[task_id] = tenths
            info = task.fields.get("info", "")
            self.console.print(
                f"{task.description}: {task.completed:.0f}/{task.total:.0f} {info} ({task.elapsed or 0:.0f} s)"
            )


def progress_bar(
    console: Console | None = None,
    *,
    transient: bool = True,
    remaining: bool = False,
    info: bool = False,
    enabled: bool = True,
) -> LoggedProgress:
    """A progress display on ``console`` (default: stderr): description, bar, done / total,
    elapsed time; with ``remaining`` the time left, with ``info`` a task's ``info`` field.
    ``transient``: the bars vanish when done; ``enabled=False``: silent."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    columns.append(TimeElapsedColumn())
    if remaining:
        columns.append(TimeRemainingColumn())
    return LoggedProgress(
        *columns, console=console or Console(stderr=True), transient=transient, disable=not enabled
    )


MODES = ("auto", "always", "never")
"""When :class:`Bars` show: ``auto`` on a terminal only, ``always`` (off a terminal, a logged
line per tenth of a task), ``never``."""


class Bars(LoggedProgress):
    """The progress display every long task of a run shares: a :class:`heedful.progress.Reporter`
    (install it with :func:`heedful.progress.reporting`) whose tasks -- the library's own and
    the commands' -- appear as bars of one rich display on ``console`` (description, bar,
    done / total, elapsed, estimated time left). The display starts with the first task or
    ``with`` block and ends with the last, so that it never overlaps another live display
    (a spinner while a model loads). ``mode``: one of :data:`MODES`."""

    def __init__(self, console: Console | None = None, mode: str = "auto") -> None:
        super().__init__(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=console or Console(stderr=True), transient=True,
        )
        self._depth = 0
        self.configure(mode)

    def configure(self, mode: str) -> None:
        """Show the bars as ``mode`` says (see :data:`MODES`)."""
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._decide()

    def _decide(self) -> None:
        # asked again whenever the display starts: stderr may have been redirected since
        self.disable = self.mode == "never" or (self.mode == "auto" and not self.console.is_terminal)

    # a ``with`` block (a command's own bars) and a library task each hold the display open
    def __enter__(self) -> Bars:
        if self._depth == 0:
            self._decide()
            self.start()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.stop()
            for task in list(self.tasks):
                self.remove_task(task.id)
            self._logged_tenths.clear()

    # heedful.progress.Reporter
    def start(self, description: str | None = None, total: float | None = None):  # type: ignore[override]
        if description is None:  # rich's own start of the live display
            return super().start()
        self.__enter__()
        return self.add_task(description, total=total)

    def finish(self, handle) -> None:
        self.remove_task(handle)
        self.__exit__()


@contextmanager
def show_progress(mode: str = "auto", console: Console | None = None) -> Iterator[Bars]:
    """Show the library's long tasks (ablations, solver steps, sweep points, examples) as bars
    on stderr inside the block -- what the command line does for every command::

        with show_progress():
            model.explain(document, "context_cite", target=" positive")
    """
    from heedful.progress import reporting

    bars = Bars(console, mode)
    with reporting(bars):
        yield bars
