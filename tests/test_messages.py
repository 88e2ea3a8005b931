"""Every help text and error message shows what it says: a bracketed extra (``heedful[ray]``)
is never eaten as rich markup, and no markup tag (``[bold]``, ``[/]``) leaks as text."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from heedful import cli
from heedful.commands.console import print_error
from heedful.errors import EXTRAS, HeedfulError, install_hint

ROOT = Path(__file__).resolve().parents[1]
TAG = re.compile(
    r"\[/?(?:bold|dim|italic|underline|reverse|strike|blink|red|green|yellow|blue|cyan|magenta|white|black|link)\b[^\]]*\]|\[/\]"
)
"""A rich markup tag left as text."""
BRACKETED = re.compile(r"\[[^\]\s]+\]")
"""A bracketed word (``[ray]``, ``[MASK]``) that rich markup would read as a tag."""
INSTALL = re.compile(r"pip install (\S+)")
EXTRA = re.compile(r"""['"]heedful\[(\w+)\]['"]""")


def commands(group=None, path=()):
    """Every command and sub-command of the ``heedful`` app: ``(path, click command)``."""
    group = group or typer.main.get_command(cli.app)
    yield path, group
    for name, command in sorted(getattr(group, "commands", {}).items()):
        yield from commands(command, (*path, name))


def intended(text: str | None) -> str:
    """What a help text should show: its markup escapes undone."""
    return (text or "").replace("\\[", "[")


def check_installs(text: str, where: str) -> None:
    """Every ``pip install heedful...`` in ``text`` names one of the extras, bracket included."""
    for found in INSTALL.finditer(text):
        target = found.group(1)
        if "heedful" not in target:
            continue  # another package (spacy)
        extra = EXTRA.match(target)
        assert extra is not None, f"{where}: {found.group(0)!r} names no extra (markup ate the bracket?)"
        assert extra.group(1) in EXTRAS, f"{where}: unknown extra {extra.group(1)!r}"


@pytest.fixture(scope="module")
def helps():
    """Every command's ``--help``, rendered wide enough that nothing wraps."""
    runner = CliRunner()
    width = typer.rich_utils.MAX_WIDTH
    typer.rich_utils.MAX_WIDTH = 4000
    try:
        found = {}
        for path, command in commands():
            result = runner.invoke(cli.app, [*path, "--help"])
            assert result.exit_code == 0, f"heedful {' '.join(path)} --help: {result.output}"
            found[path] = (command, result.output)
        return found
    finally:
        typer.rich_utils.MAX_WIDTH = width


def test_the_walk_reaches_every_command(helps):
    names = {" ".join(path) for path in helps}
    for expected in ("explain", "bench", "bench merge", "models build", "serve", "interest"):
        assert expected in names


def test_every_help_shows_its_brackets_and_no_markup(helps):
    for path, (command, output) in helps.items():
        where = f"heedful {' '.join(path)} --help"
        texts = [command.help, *(getattr(p, "help", None) for p in command.params)]
        for text in texts:
            for word in BRACKETED.findall(intended(text)):
                assert word in output, f"{where}: {word!r} of {text!r} is missing (read as markup)"
        assert not TAG.search(output), f"{where}: markup leaks: {TAG.search(output).group(0)!r}"
        check_installs(output, where)


def test_bench_help_names_the_ray_extra(helps):
    _, output = helps[("bench",)]
    assert "pip install 'heedful[ray]'" in output


def test_extras_are_the_projects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert set(EXTRAS) == set(project["optional-dependencies"]) - {"test"}
    assert install_hint("serve") == "pip install 'heedful[serve]'"
    with pytest.raises(KeyError):
        install_hint("gpu")


def error_texts():
    """Every string given to an ``...Error(...)`` call in heedful's source (messages and hints,
    the literal parts of f-strings), with where it is."""
    for path in sorted((ROOT / "heedful").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if not name.endswith("Error"):
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                for part in ast.walk(arg):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        yield f"{path.relative_to(ROOT)}:{node.lineno}", part.value


def test_no_error_message_holds_markup_or_names_an_extra_without_its_bracket():
    texts = list(error_texts())
    assert len(texts) > 200  # the walk found heedful's messages
    for where, text in texts:
        assert not TAG.search(text), f"{where}: markup in a message printed as plain text: {text!r}"
        check_installs(text, where)


def printed(exc: HeedfulError, capsys) -> str:
    print_error(exc.message, exc.hint)
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    ("extra", "make"),
    [
        ("parquet", lambda: __import__("heedful.evaluate.export", fromlist=["x"]).require_pyarrow()),
        ("ray", lambda: __import__("heedful.evaluate.ray_engine", fromlist=["x"]).import_ray()),
    ],
)
def test_a_missing_extra_is_named_with_its_bracket(extra, make, monkeypatch, capsys):
    for module in ("pyarrow", "pyarrow.parquet", "ray"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(HeedfulError) as info:
        make()
    assert f"pip install 'heedful[{extra}]'" in printed(info.value, capsys)
