"""Signs of life: the library reports the steps of its long tasks (heedful.progress) and the
command line shows them as bars on stderr -- on a terminal, not with --quiet, and off a
terminal only when asked (--progress)."""

from __future__ import annotations

import pytest
from conftest import saved_tiny
from tiny import tiny_model

from heedful.progress import reporting, task


class Recorder:
    """A reporter that keeps what it heard: ``[description, total, steps advanced, finished]``."""

    def __init__(self) -> None:
        self.tasks: list[list] = []

    def start(self, description, total):
        self.tasks.append([description, total, 0, False])
        return len(self.tasks) - 1

    def advance(self, handle, steps):
        self.tasks[handle][2] += steps

    def finish(self, handle):
        self.tasks[handle][3] = True


def test_a_task_reports_only_where_a_reporter_is_installed():
    with task("nobody listens", total=3) as t:
        t.advance()  # no reporter: nothing happens, nothing fails
    heard = Recorder()
    with reporting(heard), pytest.raises(RuntimeError), task("work", total=4) as t:
        t.advance(2)
        raise RuntimeError("stops half-way")
    assert heard.tasks == [["work", 4, 2, True]]  # its end heard even when the block raised


def test_ablation_chunks_and_solver_steps_report_progress():
    model = tiny_model("bert")
    text = "a charming and often affecting journey. it moves. it never drags. the end is sad"
    heard = Recorder()
    with reporting(heard):
        model.explain(text, "context_cite", n_ablations=12, internal_batch_size=4, sources="sentences")
    copies = [t for t in heard.tasks if t[0].startswith("passes over")]
    assert copies and all(t[3] and t[2] == t[1] for t in copies)  # every ablation chunk advanced it
    assert any(t[1] >= 12 for t in copies)
    heard = Recorder()
    with reporting(heard):
        model.explain("great acting", "coperturbation", solver="adam", max_steps=30, tol=0.0)
    solver = [t for t in heard.tasks if t[0].startswith("co-perturbation solver steps")]
    assert solver == [["co-perturbation solver steps (1 texts)", 30, 30, True]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert", "classification")


def _layers(monkeypatch, capsys, model_dir: str, out, *flags: str, terminal: bool) -> tuple[str, str]:
    """``heedful interest layers`` on the tiny model (its co-perturbation solver runs 60 steps),
    stderr a terminal to rich or not: ``(stdout, stderr)``."""
    from conftest import run_cli

    from heedful.commands import console

    monkeypatch.delenv("HEEDFUL_PROGRESS", raising=False)
    monkeypatch.setattr(console.err, "_force_terminal", terminal)
    monkeypatch.setattr(console.err, "is_interactive", terminal)
    code, stdout, stderr = run_cli(
        monkeypatch, capsys, "interest", "layers", "a charming and often affecting journey",
        "--model", model_dir, "--max-steps", "60", "--out", str(out), *flags,
    )
    assert code == 0, stderr[-3000:]
    return stdout, stderr


def test_a_long_command_shows_progress_on_a_terminal_and_not_with_quiet(monkeypatch, capsys, model_dir, tmp_path):
    stdout, shown = _layers(monkeypatch, capsys, model_dir, tmp_path / "a.png", terminal=True)
    assert "co-perturbation solver steps" in shown
    assert "/60" in shown  # done / total
    again, quiet = _layers(monkeypatch, capsys, model_dir, tmp_path / "b.png", "--quiet", terminal=True)
    assert "solver steps" not in quiet
    assert again == stdout  # the results themselves are the same


def test_off_a_terminal_progress_only_when_asked(monkeypatch, capsys, model_dir, tmp_path):
    _, silent = _layers(monkeypatch, capsys, model_dir, tmp_path / "a.png", terminal=False)
    assert "solver steps" not in silent
    _, asked = _layers(monkeypatch, capsys, model_dir, tmp_path / "b.png", "--progress", terminal=False)
    lines = [line for line in asked.splitlines() if "co-perturbation solver steps" in line]
    assert lines and lines[-1].split(": ", 1)[1].startswith("60/60")  # a logged line per tenth
