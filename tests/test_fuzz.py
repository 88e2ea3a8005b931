"""Property-based fuzzing of every user-facing surface: each input either works or ends in a
one-line heedful error with a hint (exit code 2 on the command line) -- never a traceback, a raw
Python / torch / SQLite error, or work lost to a check that could have come first.

Seeded (``derandomize=True``) and bounded, on the tiny seeded models of tests/tiny.py. The
inputs tried per surface are counted (``conftest.FUZZ_INPUTS``) and reported at the end of the
session (``<basetemp>/fuzz-inputs.json``)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FUZZ_INPUTS, cached_model, saved_tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import heedful
from heedful.errors import HeedfulError

FUZZ = settings(
    derandomize=True, deadline=None, max_examples=15, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
FEW = settings(FUZZ, max_examples=6)

# ------------------------------------------------------------------------ inputs
NASTY_TEXTS = [
    "", " ", "\t\n \r", "\x00", "a\x00b", "\x1b[31mred\x1b[0m", "\x07\x08\x7f", "\ud800", "bad \udfff end",
    "\u202eevil\u202c", "مرحبا بالعالم", "שלום עולם", "😀👍🏽🏳️‍🌈", "\u200b\u200d", "\ufeffbom", "[b]bold[/b]", "[/x]",
    "[bold red]x[/]", "<script>alert(1)</script>", "&lt;b&gt;", "{}", "%s %d", "\\", "a" * 3000, "word " * 2000,
]
HUGE_TEXT = "good fun " * 116_000  # ~1 MB
texts = st.one_of(
    st.sampled_from(NASTY_TEXTS),
    st.text(max_size=60),
    st.text(st.characters(codec=None, categories=["Cs", "Cc", "Zs", "Mn", "So", "Lo"]), max_size=20),
)
numbers = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, -(2**63), 2**63, 0.5, -0.0, math.nan, math.inf, -math.inf, 1e308, True, False]),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
)
values = st.one_of(numbers, texts, st.none(), st.lists(numbers, max_size=3), st.dictionaries(st.text(max_size=3), numbers, max_size=2))


def tried(surface: str) -> None:
    FUZZ_INPUTS[surface] = FUZZ_INPUTS.get(surface, 0) + 1


def works_or_heedful_error(fn):
    """``fn()``'s result, or the :class:`HeedfulError` it raised -- whose message is one line
    and which says what to do. Any other exception fails the test."""
    try:
        return fn()
    except HeedfulError as exc:
        assert exc.message.strip() and "\n" not in exc.message, repr(exc.message)
        return exc


# ------------------------------------------------------------------------ Python API
@pytest.fixture(scope="module")
def bert():
    return cached_model("bert")


@pytest.fixture(scope="module")
def gpt2():
    return cached_model("gpt2", "causal_lm")


@FUZZ
@given(text=texts)
def test_api_texts(bert, text):
    tried("api texts")
    found = works_or_heedful_error(lambda: bert.explain(text, "saliency"))
    if not text.strip():
        assert isinstance(found, heedful.InputError)
    if isinstance(found, heedful.Explanation):
        assert np.isfinite(found.scores).all() and len(found.tokens) == len(found.scores)


def test_api_huge_and_surrogate_texts(bert):
    tried("api texts")
    with pytest.warns(UserWarning, match="truncated"):
        e = bert.explain(HUGE_TEXT, "saliency")
    assert e.truncated and len(e.tokens) == bert.adapter.max_length
    for text in ("\ud800", "fine", "x\udcffy"):
        tried("api texts")
        found = works_or_heedful_error(lambda t=text: bert.explain(["good", t]))
        assert (text == "fine") != isinstance(found, heedful.InputError)


CHEAP_METHODS = ["saliency", "grad_x_input", "integrated_gradients", "leave_one_out", "smoothgrad", "normxlogit", "raw_attention", "rollout"]


@FUZZ
@given(
    method=st.one_of(st.sampled_from(CHEAP_METHODS), texts),
    key=st.one_of(st.sampled_from(["n_steps", "n_samples", "noise", "baseline", "layer", "head", "seed", "norm", "max_length", "batch_size", "removal", "internal_batch_size"]), st.text(max_size=8)),
    value=values,
)
def test_api_options(bert, method, key, value):
    tried("api options")
    if key in ("n_steps", "n_samples") and isinstance(value, int) and value > 8:
        value = 8  # valid but slow
    found = works_or_heedful_error(lambda: bert.explain("good fun", method, **{key: value}))
    if isinstance(value, float) and not math.isfinite(value) and key in ("n_steps", "n_samples", "noise", "layer", "head", "seed", "max_length", "batch_size"):
        assert isinstance(found, HeedfulError), f"{key}={value} accepted"


targets = st.one_of(
    st.none(), numbers, texts, st.sampled_from(["POSITIVE", "NEGATIVE vs POSITIVE", " vs ", "HAPPY", "0 vs 0", "xyz vs abc", " zzzqqq", "\ud800"]),
    st.tuples(numbers, numbers), st.lists(st.one_of(numbers, texts), max_size=3),
)


@FUZZ
@given(target=targets)
def test_api_targets_classifier(bert, target):
    tried("api targets")
    found = works_or_heedful_error(lambda: bert.explain("good fun", "saliency", target))
    if isinstance(target, str) and target.strip() and target not in ("POSITIVE", "NEGATIVE", "NEUTRAL") and not target.isdigit() and " vs " not in target:
        assert isinstance(found, heedful.InputError), f"target {target!r} accepted"


@FUZZ
@given(target=targets)
def test_api_targets_language_model(gpt2, target):
    tried("api targets")
    works_or_heedful_error(lambda: gpt2.explain("the capital of", "saliency", target))


@FEW
@given(methods=st.lists(st.one_of(st.sampled_from(CHEAP_METHODS[:4]), texts), max_size=3), key=st.sampled_from(["n_steps", "foo", "seed"]), value=values)
def test_api_compare(bert, methods, key, value):
    tried("api compare")
    found = works_or_heedful_error(lambda: bert.compare("good fun", methods, **{key: value}))
    if not methods:
        assert isinstance(found, HeedfulError)


@FEW
@given(
    batch_size=numbers, chunk=st.one_of(st.none(), numbers),
    metrics=st.one_of(st.sampled_from(["aopc", "sufficiency", "accuracy", "aopc,nonsense", ""]), texts),
)
def test_api_evaluate(bert, batch_size, chunk, metrics):
    tried("api evaluate")
    from heedful.evaluate import evaluate

    explanations = bert.explain(["good fun", "dull"], "saliency")
    found = works_or_heedful_error(lambda: evaluate(bert, explanations, metrics, batch_size=batch_size, chunk=chunk))
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        assert isinstance(found, heedful.InputError)


# ------------------------------------------------------------------------ model folders and stores
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A good tiny model folder and broken copies of it."""
    import shutil

    root = tmp_path_factory.mktemp("fuzz-models")
    good = Path(saved_tiny(root / "good", "bert"))
    broken = {}

    def copy(name: str) -> Path:
        broken[name] = root / name
        shutil.copytree(good, broken[name])
        return broken[name]

    config = json.loads((good / "config.json").read_text())
    (copy("wrong model_type") / "config.json").write_text(json.dumps({**config, "model_type": "nosucharch"}))
    (copy("no model_type") / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "model_type"}))
    (copy("corrupt config") / "config.json").write_text('{"model_type": "bert", ')
    weights = good / "model.safetensors"
    (copy("truncated weights") / "model.safetensors").write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy("garbage weights") / "model.safetensors").write_bytes(b"\x00" * 64)
    (copy("no weights") / "model.safetensors").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken.get("no tokenizer") or copy("no tokenizer")).joinpath(name).unlink()
    (copy("corrupt tokenizer") / "tokenizer.json").write_text("{not json")
    (root / "empty").mkdir()
    broken["empty dir"] = root / "empty"
    broken["missing"] = root / "no-such-folder"
    broken["a file"] = weights
    return good, broken


def test_api_load_broken_folders(folders):
    good, broken = folders
    for name, path in broken.items():
        tried("api load")
        with pytest.raises(HeedfulError) as info:
            heedful.load(path)
        assert "\n" not in info.value.message and info.value.hint, (name, info.value)
    assert heedful.load(good).task == "classification"


@FEW
@given(name=st.one_of(texts, st.sampled_from(["org/model", "bert-base-uncased", "hf://x", "../..", "~nobody/x", "heedful"])))
def test_api_load_names_fail_fast_offline(name):
    """A name that is no zoo model and no folder is refused at once: the suite runs with the hub
    offline (HF_HUB_OFFLINE), and a hub id not in the cache is one line."""
    import time

    tried("api load")
    start = time.perf_counter()
    found = works_or_heedful_error(lambda: heedful.load(name))
    assert isinstance(found, HeedfulError) and time.perf_counter() - start < 10


@FEW
@given(device=st.one_of(texts, st.sampled_from(["nonsense", "cuda", "cuda:7", "mps", "meta", "cpu:0", "gpu", "cpu"])))
def test_api_load_devices(folders, device):
    tried("api load")
    found = works_or_heedful_error(lambda: heedful.load(folders[0], device=device))
    assert isinstance(found, heedful.Model) == (device in ("cpu", "cpu:0")), (device, found)


def test_stores(tmp_path):
    from heedful.evaluate.store import ResultsStore

    good = tmp_path / "good"
    with ResultsStore(good):
        pass
    data = (good / "results.sqlite").read_bytes()
    cases = {}
    (tmp_path / "truncated").mkdir()
    (tmp_path / "truncated" / "results.sqlite").write_bytes(data[: len(data) // 3] or b"SQLite format 3\x00")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "results.sqlite").write_bytes(b"not a database at all" * 100)
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    other.commit()
    other.close()
    (tmp_path / "dir.sqlite").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = ["truncated", "garbage", "other.sqlite", "dir.sqlite", "afile/below"]
    for name in cases:
        tried("api stores")
        with pytest.raises(HeedfulError) as info:
            ResultsStore(tmp_path / name)
        assert "\n" not in info.value.message and info.value.hint, (name, info.value)
    # locked by another process's write: a one-line error after the (short) timeout
    holder = sqlite3.connect(good / "results.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        tried("api stores")
        with pytest.raises(HeedfulError, match="locked"):
            ResultsStore(good, timeout=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with ResultsStore(good) as store:  # and fine again once free
        assert store.written["explanations"] == 0


# ------------------------------------------------------------------------ the command line
class LoadedAfterChecks(Exception):
    """Raised instead of loading a model: every check before the work passed."""


def cli(*args: str, stdin: str = "") -> tuple[int, str, str]:
    """``heedful ARGS`` in process: ``(exit code, stdout, stderr)``."""
    from heedful import cli as cli_module

    out, err = io.StringIO(), io.StringIO()
    code = 0
    old = sys.argv, sys.stdin
    sys.argv, sys.stdin = ["heedful", *args], io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli_module.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv, sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, err: str, *, surface: str, args=()) -> bool:
    """Exit 0, or exit 2 with exactly one ``error:`` line and one ``hint:`` line after it (and
    nothing else after them). True if it was an error."""
    tried(surface)
    assert "Traceback" not in err, (args, err)
    if code == 0:
        return False
    assert code == 2, (args, code, err)
    lines = [line for line in err.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, (args, err)
    assert lines[starts[0] + 1 :] and lines[starts[0] + 1].startswith("hint: ") and len(lines) == starts[0] + 2, (args, err)
    return True


@pytest.fixture(scope="module")
def model_dir(folders):
    return str(folders[0])


@pytest.fixture
def no_load(monkeypatch):
    """``heedful.load`` raises :class:`LoadedAfterChecks`: a command got past its checks."""

    def refuse(*a, **k):
        raise LoadedAfterChecks

    from heedful import loading

    monkeypatch.setattr(heedful, "load", refuse)
    monkeypatch.setattr(loading, "load", refuse)


def cli_checks(surface: str, *args: str) -> bool:
    """Run a command whose model load is refused: True if it stopped with a one-line error,
    False if it got past every check to the load."""
    try:
        code, _, err = cli(*args)
    except LoadedAfterChecks:
        tried(surface)
        return False
    return one_line_error(code, err, surface=surface, args=args)


@FEW
@given(text=texts)
def test_cli_explain_texts(model_dir, text):
    args = ("explain", text, "-m", model_dir, "-M", "saliency")
    code, out, err = cli(*args)
    if one_line_error(code, err, surface="cli explain texts", args=args):
        return
    assert text.strip() and out.strip()


def test_cli_explain_files(model_dir, tmp_path):
    files = {
        "missing": tmp_path / "missing.txt",
        "directory": tmp_path,
        "binary": tmp_path / "binary.bin",
        "non-UTF-8": tmp_path / "latin1.txt",
        "empty": tmp_path / "empty.txt",
        "blank lines": tmp_path / "blank.txt",
    }
    files["binary"].write_bytes(bytes(range(256)) * 4)
    files["non-UTF-8"].write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    files["empty"].write_bytes(b"")
    files["blank lines"].write_text("\n  \n\t\n")
    for path in files.values():
        code, _, err = cli("explain", "-m", model_dir, "-M", "saliency", "--file", str(path))
        assert one_line_error(code, err, surface="cli explain files", args=(path,))
    huge = tmp_path / "huge.txt"
    huge.write_text(HUGE_TEXT + "\n", encoding="utf-8")  # one 1 MB line: truncated, explained
    code, out, err = cli("explain", "-m", model_dir, "-M", "saliency", "--file", str(huge), "--json")
    assert not one_line_error(code, err, surface="cli explain files") and json.loads(out)["truncated"]


@FEW
@given(data=st.binary(max_size=300))
def test_cli_explain_file_bytes(model_dir, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "input.txt"
    path.write_bytes(data)
    code, _, err = cli("explain", "-m", model_dir, "-M", "saliency", "--file", str(path), "--json")
    one_line_error(code, err, surface="cli explain files", args=(data,))


@FUZZ
@given(
    flag=st.sampled_from(["-o", "--method", "--device", "--seed", "--batch-size", "--max-memory", "--target", "--quantity", "--sources", "--generate", "--nonsense"]),
    value=st.one_of(texts, st.sampled_from(["n_steps=abc", "n_steps=nan", "n_steps=-1", "noeq", "=", "[/x]", "[b]", "nonsense", "cuda:9", "-1", "0", "nan", "inf", "1e309", "4GB", "-4GB", "tokens:0", "tokens:x"])),
)
def test_cli_explain_options(no_load, model_dir, flag, value):
    args = ("explain", "good fun", "-m", model_dir, flag, value)
    stopped = cli_checks("cli explain options", *args)
    if flag == "--seed" and value.strip().lstrip("-").isdigit() and int(value) < 0:
        assert stopped
    if flag == "--device" and value not in ("cpu", "cpu:0"):
        assert stopped


def test_cli_explain_checks_outputs_before_any_work(no_load, model_dir, tmp_path):
    for html in (tmp_path / "missing" / "x.html", tmp_path, tmp_path / "file.txt" / "x.html", Path("/proc/nope/x.html")):
        (tmp_path / "file.txt").write_text("x")
        assert cli_checks("cli explain options", "explain", "good", "-m", model_dir, "--html", str(html))  # no load: nothing lost
    assert not cli_checks("cli explain options", "explain", "good", "-m", model_dir, "--html", str(tmp_path / "ok.html"))


def test_cli_markup_is_text(no_load):
    for name in ("[/x]", "[bold]x[/bold]", "[link=file:///etc]x"):
        code, _, err = cli("methods", name)
        assert one_line_error(code, err, surface="cli other commands") and name in err


@FUZZ
@given(n=st.integers(-5, 0), flag=st.sampled_from(["--n", "--batch-size"]))
def test_cli_bench_counts(no_load, tmp_path_factory, n, flag):
    out = tmp_path_factory.mktemp("bench")
    assert cli_checks("cli bench", "bench", "-m", "x", "-d", "movies", "--methods", "random", flag, str(n), "--out", str(out))


def test_cli_bench_outputs(no_load, tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "below", Path("/proc/nope")):
        assert cli_checks("cli bench", "bench", "-m", "x", "-d", "movies", "--methods", "random", "--n", "2", "--out", str(out))
    assert not cli_checks("cli bench", "bench", "-m", "x", "-d", "movies", "--methods", "random", "--n", "2", "--out", str(tmp_path / "new"))


COMMANDS = [
    ("interest", "layers", "good fun", "--lam"),
    ("interest", "layers", "good fun", "--seed"),
    ("interest", "layers", "good fun", "--max-steps"),
    ("interest", "layers", "good fun", "--layers"),
    ("interest", "lambda-sweep", "good fun", "-w", "good", "--lams"),
    ("rectify", "--ratio"),
    ("rectify", "--n"),
    ("rectify", "--sweep", "--ratios"),
    ("rectify", "--option"),
    ("reproduce", "normxlogit", "--n"),
    ("reproduce", "nosuch", "--n"),
    ("steer", "-p", "hello there", "-s", "hello", "--seed"),
    ("steer", "-p", "hello there", "-s", "hello", "--option"),
    ("trace", "good fun", "--corrupt", "good", "--samples"),
    ("trace", "good fun", "--corrupt", "good", "--noise"),
    ("trace", "good fun", "--corrupt", "good", "--window"),
    ("trace", "good fun", "--corrupt", "good", "--kind"),
    ("counterfactual", "-M", "random", "--k"),
    ("counterfactual", "-M", "random", "--margin"),
    ("counterfactual", "-M", "random", "--n"),
    ("heads", "--xi-pos"),
    ("heads", "--n"),
    ("models", "build"),
    ("methods",),
    ("bench", "--model", "x", "--dataset", "movies", "--methods"),
    ("bench", "--model", "x", "--dataset", "movies", "--methods", "random", "--option"),
]


@FUZZ
@given(command=st.sampled_from(COMMANDS), value=st.one_of(numbers.map(str), texts, st.sampled_from(["nan", "-1", "0", "inf", "lam=nan", "window=abc", "x.y=1", "[/x]", "1,nan", ""])))
def test_cli_other_commands(no_load, tmp_path_factory, command, value):
    out = tmp_path_factory.mktemp("cmd")
    extra = ("--out", str(out / "plot.png")) if command[0] == "interest" else ("--out", str(out)) if command[0] in ("bench", "rectify", "reproduce") else ()
    if command == ("models", "build"):
        extra = ("--help",) if value.startswith("-") else ()  # never build a real zoo model here
    args = (*command, value, *extra) if command[0] != "reproduce" else (*command, value, "--store", str(out / "store"), *extra)
    stopped = cli_checks("cli other commands", *args)
    numeric = value.strip().lower()
    if command[-1] in ("--lam", "--ratio", "--n", "--seed", "--max-steps", "--samples", "--noise", "--window", "--k", "--margin") and numeric in {"nan", "-1", "inf"} | ({"0"} if command[-1] in ("--n", "--ratio", "--max-steps", "--samples", "--noise", "--window", "--k") else set()):
        assert stopped, args


def test_cli_usage_errors_are_one_line():
    for args in (("nosuchcommand",), ("explain", "--nosuch"), ("explain", "x", "-b", "abc"), ("bench", "--n", "x"), ("interest", "layers")):
        code, _, err = cli(*args)
        assert one_line_error(code, err, surface="cli other commands", args=args)
