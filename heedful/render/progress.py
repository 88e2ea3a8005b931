"""Progress bars: one rich display for every long job heedful runs (explaining, benchmarking,
building models), which also logs a line at every tenth of a task when stderr is no terminal."""

from __future__ import annotations

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
