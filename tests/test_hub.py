"""Models from the hub, through the real download code and without the internet: a loopback
server answers the hub's file API (``tests/hub_server.py``) and each load runs in a fresh
process with ``HF_ENDPOINT``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` set as a user would set them
(``huggingface_hub`` reads them when it is imported)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_cases import run_cli_cases
from hub_server import LoopbackHub, Repo, folder_files

from heedful.testing import tiny_hf

LOAD = """
import json, os, sys
from pathlib import Path
import heedful
found = []
for name, revision in zip(sys.argv[1::2], sys.argv[2::2]):
    m = heedful.load(name, revision=(revision or None), progress=False)
    e = m.explain("The capital of France is", "saliency")
    snapshots = Path(os.environ["HF_HOME"]) / "hub" / "models--tiny--llama" / "snapshots"
    found.append({"task": m.task, "name": m.name, "tokens": len(e.scores), "layers": m.hf_model.config.num_hidden_layers,
                  "snapshots": sorted(p.name for p in snapshots.iterdir())})
print(json.dumps(found))
"""
"""Loads each (name, revision) pair of its arguments in turn, in one process, and prints what each
load gave and which snapshots the cache then holds."""

MAIN, OLD = "a" * 40, "b" * 40


def _files(tmp: Path, layers: int, pickle: bool = False) -> dict[str, bytes]:
    model, tokenizer = tiny_hf("llama", "causal_lm", num_hidden_layers=layers)
    folder = tmp / f"llama-{layers}-{pickle}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    files = folder_files(folder)
    if pickle:  # the weights as a pickle only (never unpickled: refused before the download)
        files = {name: data for name, data in files.items() if not name.endswith(".safetensors")}
        files["pytorch_model.bin"] = b"\x80\x04not really a pickle"
    return files


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    main, old = _files(tmp, 2), _files(tmp, 1)
    with_code = dict(main)
    with_code["config.json"] = json.dumps({**json.loads(main["config.json"]), "auto_map": {"AutoModelForCausalLM": "modeling.Mine"}}).encode()
    repos = {
        "tiny/llama": Repo({MAIN: main, OLD: old}, {"main": MAIN, "v1": OLD}),
        "tiny/pickled": Repo({MAIN: _files(tmp, 2, pickle=True)}, {"main": MAIN}),
        "tiny/gated": Repo({MAIN: main}, {"main": MAIN}, gated=True),
        "tiny/corrupt": Repo({MAIN: main}, {"main": MAIN}, corrupt={"model.safetensors"}),
        "tiny/custom-code": Repo({MAIN: with_code}, {"main": MAIN}),
    }
    with LoopbackHub(repos) as server:
        yield server


FETCH = """
import json, sys, time
from heedful.errors import HeedfulError
from heedful.hub import fetch
started = time.monotonic()
try:
    fetch(sys.argv[1], progress=False)
except HeedfulError as error:
    print(json.dumps({"error": error.message, "seconds": time.monotonic() - started}))
"""


def _environment(home: Path, endpoint: str, offline: bool = False) -> dict[str, str]:
    """The environment a user sets for the hub at ``endpoint`` with its cache in ``home``."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _run(args: list[str], home: Path, endpoint: str, offline: bool = False, cli: bool = False, script: str = LOAD) -> subprocess.CompletedProcess:
    env = _environment(home, endpoint, offline)
    command = [sys.executable, "-m", "heedful", *args] if cli else [sys.executable, "-c", script, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _cli_cases(cases: list[list[str]], home: Path, endpoint: str) -> list[subprocess.CompletedProcess]:
    """Each command line of ``cases`` run in one fresh process (``huggingface_hub`` reads its
    environment once per process, so they share ``home`` and ``endpoint``)."""
    return run_cli_cases(cases, env=_environment(home, endpoint), timeout=120)


def _closed_endpoint() -> str:
    """The address of a loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _loaded(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_hub_id_downloads_once_then_loads_offline_at_its_revision(hub, tmp_path):
    home = tmp_path / "hf"
    # the default branch, then a revision named as every command's --model takes it: each its own
    # weights, each download leaving its commit's snapshot alone in the cache
    first, branch = _loaded(_run(["tiny/llama", "", "tiny/llama@v1", ""], home, hub.url))
    assert first == {"task": "causal_lm", "name": "tiny/llama", "tokens": first["tokens"], "layers": 2, "snapshots": [MAIN]}
    assert branch["layers"] == 1 and branch["snapshots"] == sorted([MAIN, OLD])
    downloads = [r for r in hub.requests if r.startswith("GET /tiny/llama/resolve/")]
    assert any(r.endswith("/model.safetensors") for r in downloads)
    seen = len(hub.requests)
    # the cache serves both with the hub unreachable by rule, the second by its commit
    latest, pinned = _loaded(_run(["tiny/llama", "", "tiny/llama", OLD], home, hub.url, offline=True))
    assert (latest["layers"], pinned["layers"]) == (2, 1)
    assert len(hub.requests) == seen


UNSAFE = [
    ("tiny/pickled", "has only pickled weights (pytorch_model.bin)", "--allow-pickle"),
    ("tiny/gated", "is a gated repository", "hf auth login"),
    ("tiny/corrupt", "the download of model.safetensors from tiny/corrupt is corrupt", "run the same command again"),
    ("tiny/custom-code", "runs its own Python code", "--trust-remote-code"),
    ("tiny/missing", "no model repository 'tiny/missing'", "hf auth login"),
]
SERVE_UNSAFE = [("tiny/pickled", "--allow-pickle"), ("tiny/custom-code", "--trust-remote-code")]


@pytest.fixture(scope="module")
def refused(hub, tmp_path_factory) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """``heedful explain`` on each :data:`UNSAFE` repository and ``heedful serve`` on each
    :data:`SERVE_UNSAFE` one, against the loopback hub, keyed by (command, repo), and the cache
    they share."""
    home = tmp_path_factory.mktemp("refused") / "hf"
    cases = [("explain", ["explain", "The capital of France is", "--model", repo, "--method", "saliency"]) for repo, _, _ in UNSAFE]
    cases += [("serve", ["serve", "--model", repo, "--port", str(_free_port())]) for repo, _ in SERVE_UNSAFE]
    results = _cli_cases([args for _, args in cases], home, hub.url)
    found = {(command, args[args.index("--model") + 1]): done for (command, args), done in zip(cases, results, strict=True)}
    found[("cache", "")] = home
    return found


@pytest.mark.parametrize(("repo", "says", "names"), UNSAFE)
def test_what_cannot_load_safely_is_one_line(hub, refused, repo, says, names):
    done = refused[("explain", repo)]
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and says in lines[0] and names in lines[1], done.stderr
    assert "Traceback" not in done.stderr
    if repo == "tiny/pickled":
        assert not any(r.endswith(".bin") for r in hub.requests if r.startswith("GET"))
    if repo == "tiny/corrupt":  # the corrupt file is not left in the cache to be served later
        assert not list((refused[("cache", "")] / "hub" / "models--tiny--corrupt").rglob("model.safetensors"))


def test_an_unreachable_hub_is_one_line_within_ten_seconds(tmp_path):
    closed = _closed_endpoint()
    fetched = json.loads(_run(["tiny/llama"], tmp_path / "hf", closed, script=FETCH).stdout.strip().splitlines()[-1])
    assert fetched["seconds"] < 10 and "cannot reach" in fetched["error"]
    done = _run(["explain", "hello", "--model", "tiny/llama"], tmp_path / "hf", closed, cli=True)
    assert done.returncode == 2 and "cannot reach" in done.stderr and "Traceback" not in done.stderr
    offline = _run(["explain", "hello", "--model", "tiny/llama"], tmp_path / "hf", closed, offline=True, cli=True)
    assert offline.returncode == 2 and "not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in offline.stderr


@pytest.mark.parametrize(
    ("name", "revision", "says"),
    [
        ("minilm-sentiment", "main", "is for hub ids"),
        ("tiny/llama@v1", "v2", "names a revision and revision='v2' another"),
        ("not a/hub id", None, "is not a model directory"),
    ],
)
def test_a_revision_or_id_that_cannot_apply_fails_before_any_work(name, revision, says):
    import heedful

    with pytest.raises(heedful.HeedfulError, match=says):
        heedful.load(name, revision=revision)


SCORES = """
import json, sys
import heedful
found = []
for revision in sys.argv[2:]:
    m = heedful.load(sys.argv[1], revision=revision, progress=False)
    found.append([float(s) for s in m.explain("The capital of France is", "saliency").scores])
print(json.dumps(found))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _served_scores(port: int, process: subprocess.Popen, deadline_s: float = 120.0) -> list[float]:
    """The saliency scores ``heedful serve`` at ``port`` answers, once it is up."""
    import time
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "tiny/llama", "text": "The capital of France is", "methods": ["saliency"], "curve": False}).encode()
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/explain", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310  (loopback)
                return json.loads(answer.read())["methods"][0]["scores"]
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    raise AssertionError("heedful serve did not answer")


def test_serve_loads_a_hub_model_at_its_pinned_revision(hub, tmp_path):
    home, port = tmp_path / "hf", _free_port()
    env = _environment(home, hub.url)
    command = [sys.executable, "-m", "heedful", "serve", "--model", "tiny/llama", "--revision", "v1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        served = _served_scores(port, process)
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0
    # the served model is v1's commit (one layer), as a direct load of that commit explains it
    assert [p.name for p in (home / "hub" / "models--tiny--llama" / "snapshots").iterdir()] == [OLD]
    pinned, latest = _loaded(_run(["tiny/llama", OLD, MAIN], home, hub.url, script=SCORES))
    assert served == pytest.approx(pinned, rel=1e-5, abs=1e-7)
    assert served != pytest.approx(latest, rel=1e-3, abs=1e-5)


SERVE_FLAGS = [
    (["--revision", "v1"], "no --model is given"),
    (["--model", "tiny/llama", "--model", "tiny/other", "--revision", "v1"], "pins one hub model, and 2 are given"),
    (["--model", "minilm-sentiment", "--revision", "v1"], "is for hub ids"),
    (["--model", "tiny/llama@v1", "--revision", "v2"], "names a revision and revision='v2' another"),
]


@pytest.fixture(scope="module")
def serve_flags(tmp_path_factory) -> list[subprocess.CompletedProcess]:
    """``heedful serve`` with each of :data:`SERVE_FLAGS`, with no hub to reach: each must be
    refused before any download."""
    cases = [["serve", *args, "--port", str(_free_port())] for args, _ in SERVE_FLAGS]
    return _cli_cases(cases, tmp_path_factory.mktemp("flags") / "hf", _closed_endpoint())


@pytest.mark.parametrize("case", range(len(SERVE_FLAGS)), ids=[says for _, says in SERVE_FLAGS])
def test_serve_hub_flags_that_cannot_apply_are_one_line(serve_flags, case):
    done, says = serve_flags[case], SERVE_FLAGS[case][1]
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and says in lines[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("repo", "names"), SERVE_UNSAFE)
def test_serve_refuses_what_cannot_load_safely_in_one_line(refused, repo, names):
    done = refused[("serve", repo)]
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and names in lines[1] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow  # a download and a serve process for an edge of --allow-pickle, about 17 s on 2 cores: run with -m slow
def test_serve_passes_allow_pickle_to_the_hub_path(hub, tmp_path):
    done = _run(["serve", "--model", "tiny/pickled", "--allow-pickle", "--port", str(_free_port())], tmp_path / "hf", hub.url, cli=True)
    # allowed, the pickle is downloaded and handed to transformers (which finds no model in it)
    assert done.returncode == 2 and "cannot load the weights of tiny/pickled" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert any(r.endswith("/pytorch_model.bin") for r in hub.requests if r.startswith("GET"))
