"""Shared set-up: ``tests/`` importable (``from tiny import tiny_model``), quiet transformers,
a sensible number of torch threads, and a session-wide cache of the tiny seeded models."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP pool

import torch  # noqa: E402

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the suite never needs a hub (tests/test_hub.py serves its own)

# A suite started as a background job of a non-interactive shell inherits SIGINT ignored, and so
# would every process it starts: the Ctrl-C tests (tests/test_interrupt.py, test_warm.py,
# test_bench_writers.py) need it delivered. A handled signal is reset to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)



def _isolated_home() -> None:
    """Tests write caches (head masks of tiny models, bench stores) under a temporary
    ``HEEDFUL_HOME``; the real cache's built models and downloaded data are linked in, so the
    end-to-end tests reuse them (and build them there on first use)."""
    if os.environ.get("HEEDFUL_TEST_KEEP_HOME"):
        return
    import tempfile

    from heedful.files.cache import heedful_home

    real = heedful_home()
    home = Path(tempfile.mkdtemp(prefix="heedful-test-home-"))
    for name in ("models", "data", "downloads", "packages"):
        (real / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(real / name, target_is_directory=True)
    (real / "head_masks" / "parses").mkdir(parents=True, exist_ok=True)
    (home / "head_masks").mkdir()
    (home / "head_masks" / "parses").symlink_to(real / "head_masks" / "parses", target_is_directory=True)
    os.environ["HEEDFUL_HOME"] = str(home)
    # warm workers' sockets then live in this home's run/ too: a test process never reaches the
    # user's own worker, nor another test process's (make test runs two side by side)
    os.environ.pop("XDG_RUNTIME_DIR", None)
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # links are removed, not followed


_isolated_home()

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
# tiny models: more threads only add overhead; HEEDFUL_TEST_THREADS=2 runs the suite as a 2-thread user would
torch.set_num_threads(int(os.environ.get("HEEDFUL_TEST_THREADS", "1")))
warnings.filterwarnings("ignore", module="transformers")

from heedful.testing import INIT_RANGE, conformance_model  # noqa: E402,F401  (INIT_RANGE: tests read the weight scale here)

cached_model = conformance_model
"""The tiny seeded :class:`heedful.Model` for ``(family, task)``, built once per session with
weights drawn at ``INIT_RANGE`` (the models :func:`heedful.testing.check_method` uses). Tests
must not change the weights; ``model.hf_model`` is the underlying transformers model."""


@pytest.fixture(scope="session")
def tiny():
    """``tiny(family, task="classification")`` -> cached tiny :class:`heedful.Model`."""
    return cached_model


def saved_tiny(folder: Path, family: str, task: str = "classification", **config_overrides) -> str:
    """A tiny seeded model saved as a Hugging Face folder (for commands that load a path)."""
    from tiny import tiny_hf

    hf_model, tokenizer = tiny_hf(family, task, **config_overrides)
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


REVIEWS = (
    "a charming and often affecting journey",
    "the movie was dull and far too long",
    "an intelligent , funny and moving film",
    "what a waste of a talented cast",
    "we watched it twice and loved every minute",
    "the plot is predictable yet the actors are wonderful",
)
"""Short reviews for benches on the tiny models."""


def write_reviews(path: Path, texts=REVIEWS) -> str:
    """``texts`` as a bench CSV at ``path`` (``text,label``; labels alternate NEGATIVE, POSITIVE); its path."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows((s, "POSITIVE" if k % 2 else "NEGATIVE") for k, s in enumerate(texts))
    return str(path)


def run_cli(monkeypatch, capsys, *args: str, stdin: str | None = "") -> tuple[int, str, str]:
    """Run ``heedful ARGS`` in process: ``(exit code, stdout, stderr)``."""
    import io

    from heedful import cli

    monkeypatch.setattr(sys, "argv", ["heedful", *args])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------- fuzz counts
FUZZ_INPUTS: dict[str, int] = {}
"""Inputs the fuzz suite (tests/test_fuzz.py) tried, per surface; written at the end of the
session to ``<basetemp>/fuzz-inputs.json`` and summed up in one line."""


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not FUZZ_INPUTS:
        return
    import json

    path = config._tmp_path_factory.getbasetemp() / "fuzz-inputs.json"
    path.write_text(json.dumps(dict(sorted(FUZZ_INPUTS.items())), indent=1), encoding="utf-8")
    parts = ", ".join(f"{k} {v}" for k, v in sorted(FUZZ_INPUTS.items()))
    terminalreporter.write_line(f"fuzz inputs tried: {sum(FUZZ_INPUTS.values())} ({parts}) -> {path}")
