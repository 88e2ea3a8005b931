"""The worked examples of docs/extending.md run as written (every python block, in order, in
one fresh process), and docs/design.md names modules that exist."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_extending_examples_run():
    blocks = python_blocks(DOCS / "extending.md")
    assert len(blocks) >= 8
    script = "\n\n".join(blocks)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "attention_from_anchor: layers=0 is not int >= 1" in done.stdout


def test_design_names_modules_that_exist():
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    for path in sorted(set(re.findall(r"`(heedful/[a-z_/]+\.py)`", text))):
        assert (DOCS.parent / path).is_file(), path
    for name in sorted(set(re.findall(r"`(heedful(?:\.[a-z_]+)+)`", text))):
        importlib.import_module(name)


def test_readme_attribute_paths_resolve_after_import_heedful():
    """Every ``heedful.a.b`` the README names works after a bare ``import heedful``, as a user
    types it (``heedful.datasets.load(...)``), in a fresh process."""
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    paths = sorted({p.rstrip(".") for p in re.findall(r"(?<!from )\bheedful(?:\.[A-Za-z_]+)+", readme)})
    assert "heedful.datasets.load" in paths
    script = f"import heedful\nfor p in {paths!r}:\n    eval(p, {{'heedful': heedful}})\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
