"""Start-up of the command line: wall time of fresh processes from launch to exit.

Times ``heedful --help``, ``heedful methods``, ``python -c "import heedful"`` and ``heedful
explain "a charming and often affecting journey"`` (the built zoo model minilm-sentiment, the
heatmap printed) -- each as ``python -m heedful ...`` run with this checkout first on the path,
which is what the ``heedful`` script runs. One untimed run of each warms the disk cache; the
median of ``--runs`` timed runs is reported (the targets: ``--help`` <= 0.5 s, ``methods``
<= 1 s, ``explain`` <= 3 s). With ``--baseline REF`` the same commands also run on the checkout
of commit REF (extracted with ``git archive`` into a temporary folder), interleaved run by run
so that the machine's load falls on both sides alike.

    python benchmarks/startup.py                       # -> benchmarks/results/startup.md
    python benchmarks/startup.py --baseline ef4f6a2    # before / after
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
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
    f'heedful explain "{TEXT}"': (["-m", "heedful", "explain", TEXT, "--model", "minilm-sentiment"], 3.0),
}
"""Name -> (the interpreter's arguments, target seconds)."""


def run_once(args: list[str], checkout: Path) -> float:
    """Wall seconds of one fresh ``python ARGS`` with ``checkout`` first on the path (stdout and
    stderr to a pipe, as when piped; a failing command stops the benchmark)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "100"}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {checkout}:\n{done.stderr[-2000:]}")
    return elapsed


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
        for name, (command, _) in COMMANDS.items():
            for checkout in sides.values():
                run_once(command, checkout)  # warm-up: disk cache, built model, compiled bytecode
            for _ in range(args.runs):
                for side, checkout in sides.items():
                    times.setdefault((name, side), []).append(run_once(command, checkout))
            print(name, {side: fmt_s(statistics.median(times[name, side])) for side in sides}, file=sys.stderr)
    loads.append(os.getloadavg()[0])

    header = "| command | " + " | ".join(f"{side}: median (min-max)" for side in sides) + " | target |"
    lines = [
        "# Start-up of the command line",
        "",
        f"Wall time of a fresh process from launch to exit, median of {args.runs} runs after one "
        "untimed warm-up run (`python -m heedful ...`, what the `heedful` script runs; output to a pipe). "
        f'`explain` runs the zoo model `minilm-sentiment` (built) with NormXLogit on "{TEXT}" and prints the heatmap.',
        "",
        header,
        "|---|" + "---:|" * len(sides) + "---:|",
    ]
    for name, (_, target) in COMMANDS.items():
        cells = []
        for side in sides:
            found = times[name, side]
            cells.append(f"{fmt_s(statistics.median(found))} ({fmt_s(min(found))}-{fmt_s(max(found))})")
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {'-' if target is None else f'<= {target:g} s'} |")
    lines += [
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
