"""Start-up of the command line: wall time of fresh processes from launch to exit.

Times ``heedful --help``, ``heedful methods``, ``python -c "import heedful"`` and ``heedful
explain "a charming and often affecting journey"`` (the built zoo model minilm-sentiment, the
heatmap printed) -- each as ``python -m heedful ...`` run with this checkout first on the path,
which is what the ``heedful`` script runs. One untimed run of each warms the disk cache; the
median of ``--runs`` timed runs is reported (the targets: ``--help`` <= 0.5 s, ``methods``
<= 1 s, ``explain`` <= 3 s with a warm worker, timed last: ``heedful warm --model
minilm-sentiment``, then fresh ``heedful explain`` processes sent to it). With ``--baseline REF`` the same commands also run on the checkout
of commit REF (extracted with ``git archive`` into a temporary folder), interleaved run by run
so that the machine's load falls on both sides alike. Each run's CPU seconds (user + system, of the
process and its children) are reported beside its wall time: on a shared machine the wall time
waits for the cores, the CPU time is the work. A second table splits ``explain`` into its phases
(interpreter, the command line's imports, torch, transformers' model code, heedful's loading
code, loading the model, explaining, rendering), measured the same way in fresh processes.

    python benchmarks/startup.py                       # -> benchmarks/results/startup.md
    python benchmarks/startup.py --baseline ef4f6a2    # before / after
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import ROOT, command_line, cpu_name, fmt_s, library_versions

TEXT = "a charming and often affecting journey"
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "heedful --help": (["-m", "heedful", "--help"], 0.5),
    "heedful methods": (["-m", "heedful", "methods"], 1.0),
    'python -c "import heedful"': (["-c", "import heedful"], None),
    f'heedful explain "{TEXT}"': (["-m", "heedful", "explain", TEXT, "--model", "minilm-sentiment"], None),
}
"""Name -> (the interpreter's arguments, target seconds), each run in its own process
(``HEEDFUL_WARM=never``)."""
WARM = (f'heedful explain "{TEXT}" (warm worker)', ["-m", "heedful", "explain", TEXT, "--model", "minilm-sentiment"], 3.0)
"""The same explanation sent to a warm worker (``heedful warm --model minilm-sentiment`` first)."""


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_once(args: list[str], checkout: Path, warm: str = "never") -> tuple[float, float]:
    """Wall and CPU seconds of one fresh ``python ARGS`` with ``checkout`` first on the path
    (stdout and stderr to a pipe, as when piped; a failing command stops the benchmark);
    ``warm``: ``HEEDFUL_WARM``, ``never`` (in its own process) or ``auto`` (to the worker)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "100", "HEEDFUL_WARM": warm}
    cpu = _children_cpu()
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {checkout}:\n{done.stderr[-2000:]}")
    return elapsed, _children_cpu() - cpu


PHASES = f"""
import io, json, time
marks = [("interpreter start-up", None)]
began = (time.process_time(), time.perf_counter())
def mark(name):
    marks.append((name, (time.process_time(), time.perf_counter())))
import heedful.cli; mark("the command line (typer, rich, heedful.cli)")
import torch; mark("import torch")
import transformers.modeling_utils; mark("transformers' model code (modeling_utils)")
import heedful.loading; mark("heedful's loading code (adapters, model)")
model = heedful.load("minilm-sentiment", progress=False); mark("loading the model (config, weights, tokenizer)")
expl = model.explain({TEXT!r}); mark("explaining (NormXLogit)")
from rich.console import Console
from heedful.render.terminal import heatmap_text
Console(file=io.StringIO(), width=100).print(heatmap_text(expl)); mark("rendering the heatmap")
last, out = began, []
for name, at in marks[1:]:
    out.append((name, at[0] - last[0], at[1] - last[1])); last = at
print(json.dumps(out))
"""
"""Run in a fresh process: ``[(phase, CPU s, wall s)]`` of ``heedful explain``'s work."""


def phases(checkout: Path) -> list[tuple[str, float, float]]:
    """One fresh process through :data:`PHASES`, with the interpreter's own start-up (wall and
    CPU of ``python -c pass``) as the first phase."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    bare_wall, bare_cpu = run_once(["-c", "pass"], checkout)
    done = subprocess.run([sys.executable, "-c", PHASES], cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the phases of explain failed:\n{done.stderr[-2000:]}")
    return [("interpreter start-up", bare_cpu, bare_wall), *(tuple(p) for p in json.loads(done.stdout.splitlines()[-1]))]


def warm_runs(runs: int) -> tuple[list[float], list[float], float]:
    """Wall and CPU seconds of ``runs`` fresh ``heedful explain`` processes sent to a warm
    worker of this checkout (started with the model loaded, one untimed run first, stopped
    after), and the seconds the worker took to start."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEEDFUL_WARM": "auto"}
    began = time.perf_counter()
    started = subprocess.run([sys.executable, "-m", "heedful", "warm", "--model", "minilm-sentiment"], cwd=ROOT, env=env, capture_output=True, text=True)
    if started.returncode != 0:
        raise SystemExit(f"heedful warm failed:\n{started.stderr[-2000:]}")
    start = time.perf_counter() - began
    try:
        status = subprocess.run([sys.executable, "-m", "heedful", "warm", "--status"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
        before = int(status.split(" command(s) run")[0].rsplit(" ", 1)[-1])
        run_once(WARM[1], ROOT, "auto")
        walls, cpus = [], []
        for _ in range(runs):
            wall, cpu = run_once(WARM[1], ROOT, "auto")
            walls.append(wall)
            cpus.append(cpu)
        status = subprocess.run([sys.executable, "-m", "heedful", "warm", "--status"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
        if int(status.split(" command(s) run")[0].rsplit(" ", 1)[-1]) != before + runs + 1:
            raise SystemExit(f"the explanations did not all run in the worker: {status}")
    finally:
        subprocess.run([sys.executable, "-m", "heedful", "warm", "--stop"], cwd=ROOT, env=env, capture_output=True)
    return walls, cpus, start


def extract(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` of this repository, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def revision(checkout: Path = ROOT) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (median reported)")
    parser.add_argument("--baseline", help="also time the checkout of this commit (before / after)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.md")
    args = parser.parse_args()

    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="heedful-startup-") as tmp:
        sides = {"this checkout": ROOT}
        if args.baseline:
            sides = {f"before ({args.baseline})": extract(args.baseline, Path(tmp)), **sides}
        times: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        for name, (command, _) in COMMANDS.items():
            for checkout in sides.values():
                run_once(command, checkout)  # warm-up: disk cache, built model, compiled bytecode
            for _ in range(args.runs):
                for side, checkout in sides.items():
                    wall, cpu = run_once(command, checkout)
                    times.setdefault((name, side), []).append(wall)
                    cpus.setdefault((name, side), []).append(cpu)
            print(name, {side: fmt_s(statistics.median(times[name, side])) for side in sides}, file=sys.stderr)
        split = [phases(ROOT) for _ in range(args.runs)]
        warm_walls, warm_cpus, warm_start = warm_runs(args.runs)
        print(WARM[0], fmt_s(statistics.median(warm_walls)), file=sys.stderr)
    loads.append(os.getloadavg()[0])

    header = "| command | " + " | ".join(f"{side}: median (min-max) | CPU" for side in sides) + " | target |"
    lines = [
        "# Start-up of the command line",
        "",
        f"Wall time of a fresh process from launch to exit, median of {args.runs} runs after one "
        "untimed warm-up run (`python -m heedful ...`, what the `heedful` script runs; output to a pipe). "
        f'`explain` runs the zoo model `minilm-sentiment` (built) with NormXLogit on "{TEXT}" and prints the heatmap.',
        "",
        header,
        "|---|" + "---:|---:|" * len(sides) + "---:|",
    ]
    for name, (_, target) in COMMANDS.items():
        cells = []
        for side in sides:
            found = times[name, side]
            cells.append(f"{fmt_s(statistics.median(found))} ({fmt_s(min(found))}-{fmt_s(max(found))}) | {fmt_s(statistics.median(cpus[name, side]))}")
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {'-' if target is None else f'<= {target:g} s'} |")
    warm_cell = f"{fmt_s(statistics.median(warm_walls))} ({fmt_s(min(warm_walls))}-{fmt_s(max(warm_walls))}) | {fmt_s(statistics.median(warm_cpus))}"
    lines.append(f"| `{WARM[0]}` | " + " | ".join(["- | -"] * (len(sides) - 1) + [warm_cell]) + f" | <= {WARM[2]:g} s |")
    lines += [
        "",
        "The warm row sends the same command line to a warm worker (`heedful warm --model minilm-sentiment` first, "
        f"which took {fmt_s(warm_start)} to start and load the model; one untimed run, then {args.runs} fresh `heedful` "
        "processes; CPU: the client process only, the worker computes the explanation). The other rows run each "
        "command in its own process (`HEEDFUL_WARM=never`).",
    ]
    names = [name for name, _, _ in split[0]]
    lines += [
        "",
        f"Where `heedful explain` spends its time (this checkout; each phase in a fresh process, median of {args.runs}; "
        "CPU: user + system seconds of the process):",
        "",
        "| phase | CPU | wall |",
        "|---|---:|---:|",
        *(
            f"| {name} | {fmt_s(statistics.median(run[i][1] for run in split))} | {fmt_s(statistics.median(run[i][2] for run in split))} |"
            for i, name in enumerate(names)
        ),
        f"| all | {fmt_s(statistics.median(sum(p[1] for p in run) for run in split))} | "
        f"{fmt_s(statistics.median(sum(p[2] for p in run) for run in split))} |",
        "",
        command_line(),
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- revision: {revision()}" + (f"; before: {args.baseline}" if args.baseline else ""),
        f"- machine: {platform.machine()}, {cpu_name()}, {os.cpu_count()} logical cores; load average "
        f"{loads[0]:.2f} before, {loads[1]:.2f} after (the machine is shared: other processes' load "
        "falls on every run; sides interleaved run by run)",
        f"- python {platform.python_version()}, {library_versions('torch', 'transformers', 'typer', 'rich')}",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
