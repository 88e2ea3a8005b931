"""The command line starts at once: ``import heedful`` and ``heedful --help`` / ``heedful
methods`` import neither torch nor transformers (checked in fresh processes, not timed; the
times are measured by benchmarks/startup.py), and the method catalog they read is the registry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import heedful
from heedful import catalog

HEAVY = ("torch", "transformers")


def _imported_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; which heavy modules it left imported, and its output."""
    probe = (
        "import sys, io, contextlib, json\n"
        "buffer = io.StringIO()\n"
        "with contextlib.redirect_stdout(buffer):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules], 'out': buffer.getvalue()}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _cli(*args: str) -> str:
    return f"sys.argv = ['heedful', *{list(args)!r}]\nfrom heedful.cli import main\ntry:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code"


def test_import_heedful_and_the_cli_import_no_torch():
    assert _imported_after("import heedful, heedful.cli")["heavy"] == []


@pytest.mark.parametrize("args", [("--help",), ("methods",), ("methods", "integrated_gradients"), ("explain", "--help")])
def test_help_and_the_method_table_import_no_torch(args):
    found = _imported_after(_cli(*args))
    assert found["heavy"] == []
    assert found["out"].strip()
    if args == ("methods", "integrated_gradients"):
        assert "n_steps" in found["out"] and "50" in found["out"]


def test_every_public_name_still_resolves_after_a_light_import():
    names = heedful.__all__
    found = _imported_after(
        f"import heedful\nvalues = {{n: getattr(heedful, n) for n in {names!r}}}\n"
        "print(sorted(n for n, v in values.items() if v is None))\n"
        "from heedful import load, Model, Explanation, get_method\n"
        "print(get_method('saliency').name)"
    )
    assert found["out"].split("\n")[:2] == ["[]", "saliency"]
    assert set(found["heavy"]) == set(HEAVY)  # the names were imported on use
    assert set(dir(heedful)) >= set(names)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        heedful.nonexistent  # noqa: B018


@pytest.mark.slow  # a fresh process importing every method module, about 14 s on 2 cores: run with -m slow
def test_register_sees_the_built_in_methods_first():
    """``heedful.register`` (and ``MethodInfo``) import the built-in methods before a user's
    method is registered, so a clash is reported at the user's name, as before."""
    found = _imported_after("import heedful, sys\nheedful.register\nprint('heedful.attribution.gradient' in sys.modules)")
    assert found["out"].strip() == "True"


def test_the_catalog_is_the_registry():
    """heedful/methods.json equals the registry's table (regenerate it with
    ``python -m heedful.catalog``)."""
    live = catalog.from_registry()
    assert catalog.CATALOG.read_text(encoding="utf-8") == catalog.as_json(live), "regenerate it: python -m heedful.catalog"
    assert catalog.entries() == live
    assert [m.name for m in live.methods] == [m.name for m in heedful.methods()]


def test_a_missing_or_broken_catalog_gives_way_to_the_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(catalog, "CATALOG", tmp_path / "missing.json")
    assert catalog.entries() == catalog.from_registry()
    broken = tmp_path / "methods.json"
    broken.write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(catalog, "CATALOG", broken)
    assert catalog.entries() == catalog.from_registry()


def test_an_unknown_method_name_gets_the_registry_error():
    with pytest.raises(heedful.MethodError, match="unknown method"):
        catalog.entries().find("integrated_gradient")
    assert catalog.entries().find("Integrated-Gradients").name == "integrated_gradients"
