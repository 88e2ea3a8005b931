"""Several ``heedful`` command lines in one fresh process: each runs through the CLI's ``main``,
as the ``heedful`` script runs it, with its stdout, stderr and exit code captured. A fresh process
per command line costs a torch import each (seconds on a shared CPU); tests that only need a
command's output and exit code, and no separate environment per command, share one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

RUNNER = """
import contextlib, io, json, sys, traceback
from heedful.cli import main
found = []
for args in json.loads(sys.argv[1]):
    sys.argv = ["heedful", *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    found.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(found))
"""


def run_cli_cases(cases: list[list[str]], env: Mapping[str, str] | None = None, cwd: Path | None = None,
                  timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Each command line of ``cases`` (the arguments after ``heedful``) run in turn in one fresh
    process with ``env`` and ``cwd``: a completed process per command line (its exit code, stdout
    and stderr)."""
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(cases)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])
            for args, r in zip(cases, results, strict=True)]
