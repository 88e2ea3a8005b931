"""Results stored at a method's defaults stay findable: the options that key them
(:meth:`heedful.registry.MethodInfo.key_options` of the bound defaults) are recorded per method
and version in ``tests/data/method_keys.json``. An option added to a method later enters the key
only once set (``KEYED_WHEN_SET``, :mod:`heedful.engine.options`); otherwise every result a
results store holds of the method at its defaults -- hours of a frontier, a reproduction report --
would be orphaned. A method whose computation changed bumps ``version=`` instead. A new method,
or one whose version was bumped, is recorded with (``make method NAME=...`` runs it; the other
methods' records are left as they are)::

    python tests/test_method_keys.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import heedful
from heedful.attribution import get_method
from heedful.engine.options import canonical_json

PATH = Path(__file__).resolve().parent / "data" / "method_keys.json"


def default_keys() -> dict[str, dict]:
    """Every registered method's version and the key options of its bound defaults."""
    return {info.name: {"version": info.version, "options": canonical_json(info.key_options(info.bind({})))}
            for info in sorted(heedful.methods(), key=lambda i: i.name)}


RECORDED = json.loads(PATH.read_text(encoding="utf-8")) if PATH.exists() else {}


@pytest.mark.parametrize("name", sorted(i.name for i in heedful.methods()))
def test_a_method_keys_its_defaults_as_recorded(name):
    found = default_keys()[name]
    recorded = RECORDED.get(name)
    assert recorded is not None, f"{name} is not in {PATH.name}: run python tests/test_method_keys.py"
    if found["version"] == recorded["version"]:
        assert found["options"] == recorded["options"], (
            f"{name}'s results stored at its defaults would no longer be found (key options {recorded['options']} -> "
            f"{found['options']}): mark an added option KEYED_WHEN_SET, or bump version= if the method computes something else"
        )


def test_an_added_option_marked_keyed_when_set_keeps_the_key():
    info = get_method("solvability_beam")
    assert "shortlist" not in info.key_options(info.bind({}))
    assert info.key_options(info.bind({"shortlist": 4}))["shortlist"] == 4


def recorded_with_new(recorded: dict[str, dict], found: dict[str, dict]) -> dict[str, dict]:
    """``recorded`` with the methods it lacks and those whose version moved taken from ``found``
    (a method whose key options changed at the same version keeps its record: the test fails)."""
    return {**recorded, **{name: row for name, row in found.items() if recorded.get(name, {}).get("version") != row["version"]}}


def test_only_new_methods_and_versions_are_recorded():
    recorded = {"a": {"version": 1, "options": "{}"}, "b": {"version": 1, "options": "{}"}}
    found = {"a": {"version": 1, "options": '{"x":1}'}, "b": {"version": 2, "options": '{"y":1}'}, "c": {"version": 1, "options": "{}"}}
    assert recorded_with_new(recorded, found) == {"a": recorded["a"], "b": found["b"], "c": found["c"]}


if __name__ == "__main__":
    rows = recorded_with_new(RECORDED, default_keys())
    PATH.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {PATH}: {len(rows) - len(RECORDED)} method(s) added", file=sys.stderr)
