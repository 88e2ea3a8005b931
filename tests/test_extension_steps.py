"""Every step of docs/extending.md's checklists is done for every method and family heedful
ships; a missing one fails here with one line naming the step and the command that does it.

The steps a tool cannot do: an independent oracle test named in ``tests/test_oracles.py::ORACLES``,
a tiny configuration in :data:`heedful.testing.TINY_FAMILIES`. The steps a command does: the
golden outputs (``tests/regenerate_method_outputs.py --only NAME``), the README's method table
(``heedful methods --markdown --write README.md``), the command line's catalog
(``python -m heedful.catalog``), the family table ``docs/models.md`` (``heedful models
--families --markdown``). Importing the method's module is automatic
(:data:`heedful.attribution.BUILT_IN`), unless its name starts with an underscore.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from regenerate_method_outputs import PATH as GOLDEN
from regenerate_method_outputs import REGENERATE
from test_oracles import ORACLES

import heedful
from heedful import catalog
from heedful.adapters import FAMILIES, register_family
from heedful.adapters.families import LlamaAdapter
from heedful.registry import MethodInfo, register, unregister
from heedful.render.methods import method_table
from heedful.testing import TINY_FAMILIES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODELS_MD = ROOT / "docs" / "models.md"
ATTRIBUTION = ROOT / "heedful" / "attribution"


def method_steps(infos: Mapping[str, MethodInfo]) -> list[str]:
    """One line per step a method of ``infos`` misses (name, step, the command or edit)."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))["methods"]
    readme = README.read_text(encoding="utf-8").splitlines()
    shipped = {entry.name: entry for entry in catalog.entries().methods}
    found = []
    for name, info in infos.items():
        if not ORACLES.get(name):
            found.append(
                f"{name}: no independent oracle -- write a test that computes it from the paper's equations in a "
                "plain loop (or with a peer library) and name it in tests/test_oracles.py::ORACLES"
            )
        entry = golden.get(name)
        if entry is None or entry["version"] != info.version:
            found.append(f"{name}: no golden outputs at version {info.version} -- run {REGENERATE} --only {name}")
        row = method_table([info]).splitlines()[-1]
        if row not in readme:
            found.append(f"{name}: README.md's method table lacks its row (or holds a stale one) -- run heedful methods --markdown --write README.md")
        if shipped.get(name) != catalog.entry_of(info):
            found.append(f"{name}: the command line's catalog heedful/methods.json lacks it or is stale -- run python -m heedful.catalog")
    return found


def module_steps(folder: Path = ATTRIBUTION) -> list[str]:
    """One line per module of ``folder`` that registers methods but is never imported (a name
    with a leading underscore marks a helper module, :data:`heedful.attribution.BUILT_IN`)."""
    return [
        f"heedful/attribution/{path.name}: registers methods but is never imported -- rename it without the leading underscore"
        for path in sorted(folder.glob("_*.py"))
        if path.name != "__init__.py" and re.search(r"^@register\(", path.read_text(encoding="utf-8"), re.M)
    ]


def family_steps(families: Mapping[str, type]) -> list[str]:
    """One line per step a family (``model_type`` -> adapter class) of ``families`` misses."""
    table = MODELS_MD.read_text(encoding="utf-8")
    listed = {t.strip() for line in table.splitlines() if line.startswith("| ") for t in line.split("|")[2].split(",")}
    served: dict[type, list[str]] = {}
    for model_type, adapter in families.items():
        served.setdefault(adapter, []).append(model_type)
    found = []
    for adapter, types in served.items():
        if not any(t in TINY_FAMILIES for t in types):
            found.append(
                f"{adapter.family} ({', '.join(types)}): no tiny model -- add a TinyFamily row for {types[0]!r} to "
                "heedful.testing.TINY_FAMILIES (tests/test_families.py then runs check_family on it)"
            )
        for model_type in types:
            if model_type not in listed:
                found.append(f"{model_type}: not in docs/models.md -- run heedful models --families --markdown > docs/models.md")
    return found


def test_every_shipped_method_and_family_has_done_its_steps():
    missing = method_steps({info.name: info for info in heedful.methods()}) + module_steps() + family_steps(FAMILIES)
    assert not missing, "extension steps not done:\n" + "\n".join(missing)


@pytest.fixture()
def scratch_method():
    """A method registered as a newcomer would before doing any other step."""

    @register("scratch_window_max", family="perturbation", cost="1 + N forwards")
    def scratch_window_max(problem, *, window: int = 2):
        """Largest drop of any window of tokens.

        Source: a scratch method of this test."""
        return problem.reference.logits

    yield heedful.get_method("scratch_window_max")
    unregister("scratch_window_max")


def test_a_method_missing_its_steps_is_told_each_one(scratch_method):
    found = method_steps({scratch_method.name: scratch_method})
    assert len(found) == 4, found
    oracle, golden, readme, shipped = found
    assert "tests/test_oracles.py::ORACLES" in oracle
    assert "tests/regenerate_method_outputs.py --only scratch_window_max" in golden
    assert "heedful methods --markdown --write README.md" in readme
    assert "python -m heedful.catalog" in shipped


def test_a_helper_module_that_registers_methods_is_named(tmp_path):
    (tmp_path / "_hidden.py").write_text('@register("hidden", family="baseline", cost="none")\ndef hidden(problem): ...\n')
    (tmp_path / "_masks.py").write_text("def helper(): ...\n")
    assert module_steps(tmp_path) == [
        "heedful/attribution/_hidden.py: registers methods but is never imported -- rename it without the leading underscore"
    ]


def test_a_family_missing_its_steps_is_told_each_one():
    class ScratchAdapter(LlamaAdapter):
        family = "scratch"

    register_family("scratch-llama", ScratchAdapter)
    try:
        found = family_steps({"scratch-llama": FAMILIES["scratch-llama"]})
    finally:
        FAMILIES.pop("scratch-llama")
    assert len(found) == 2, found
    assert "add a TinyFamily row for 'scratch-llama' to heedful.testing.TINY_FAMILIES" in found[0]
    assert "heedful models --families --markdown > docs/models.md" in found[1]
    # a model type served by a mapped family's class is enrolled through it
    assert family_steps({"xlm-roberta": FAMILIES["xlm-roberta"], "roberta": FAMILIES["roberta"]}) == []


# --------------------------------------------------------------------------- the tools that do the steps
def test_methods_markdown_write_splices_the_registry_table_into_a_readme(monkeypatch, capsys, tmp_path):
    from conftest import run_cli

    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\n<!-- methods: old -->\n| stale |\n<!-- /methods -->\n\nAfter.\n", encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "methods", "--markdown", "--write", str(readme))
    assert code == 0 and out == "" and "rewritten" in err
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\n<!-- methods: generated by `heedful methods --markdown --write README.md`")
    assert text.endswith("\n<!-- /methods -->\n\nAfter.\n") and "| stale |" not in text
    assert method_table(heedful.methods()) in text
    code, _, err = run_cli(monkeypatch, capsys, "methods", "--markdown", "--write", str(readme))
    assert code == 0 and "already up to date" in err and readme.read_text(encoding="utf-8") == text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--write", "{readme}"), "add --markdown"),
        (("--markdown", "--write", "{plain}"), "has no method table"),
        (("--markdown", "--write", "{absent}"), "is not a file"),
    ],
)
def test_methods_write_refuses_in_one_line(monkeypatch, capsys, tmp_path, args, words):
    from conftest import run_cli

    (tmp_path / "plain.md").write_text("no table here\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("<!-- methods: x -->\n<!-- /methods -->\n", encoding="utf-8")
    paths = {"readme": tmp_path / "README.md", "plain": tmp_path / "plain.md", "absent": tmp_path / "absent.md"}
    code, _, err = run_cli(monkeypatch, capsys, "methods", *(a.format(**paths) for a in args))
    assert code == 2 and words in err and "Traceback" not in err
    assert (tmp_path / "plain.md").read_text(encoding="utf-8") == "no table here\n"


def test_one_table_of_fast_options_serves_every_test():
    """The golden outputs, the invariance tests and check_method run methods with the same fast
    options, defined once in heedful.testing.FAST_OPTIONS."""
    import regenerate_method_outputs
    import test_invariants
    from conftest import cached_model

    from heedful import testing

    model = cached_model("bert")
    for info in heedful.methods():
        fast = testing.fast_options(info, model)
        assert regenerate_method_outputs.golden_options(info, model) == fast, info.name
        assert test_invariants.fast_options(info.name, model) == fast, info.name
    for module in (regenerate_method_outputs, test_invariants):
        assert not {"CHEAP", "FAST"} & set(vars(module)), f"{module.__name__} defines fast options of its own"


def test_methods_markdown_write_reads_the_registry_not_a_stale_catalog(monkeypatch, capsys, tmp_path, scratch_method):
    """A method registered but not yet in heedful/methods.json still gets its README row: the
    order of the checklist's commands does not matter."""
    from conftest import run_cli

    readme = tmp_path / "README.md"
    readme.write_text("<!-- methods: x -->\n<!-- /methods -->\n", encoding="utf-8")
    assert scratch_method.name not in {entry.name for entry in catalog.entries().methods}
    code, _, _ = run_cli(monkeypatch, capsys, "methods", "--markdown", "--write", str(readme))
    assert code == 0 and "| `scratch_window_max` |" in readme.read_text(encoding="utf-8")
