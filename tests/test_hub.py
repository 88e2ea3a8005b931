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
from hub_server import LoopbackHub, Repo, folder_files

from heedful.testing import tiny_hf

LOAD = """
import json, sys
import heedful
m = heedful.load(sys.argv[1], revision=(sys.argv[2] or None), progress=False)
e = m.explain("The capital of France is", "saliency")
print(json.dumps({"task": m.task, "name": m.name, "tokens": len(e.scores), "layers": m.hf_model.config.num_hidden_layers}))
"""

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


def _run(args: list[str], home: Path, endpoint: str, offline: bool = False, cli: bool = False, script: str = LOAD) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "heedful", *args] if cli else [sys.executable, "-c", script, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _loaded(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_hub_id_downloads_once_then_loads_offline_at_its_revision(hub, tmp_path):
    home = tmp_path / "hf"
    first = _loaded(_run(["tiny/llama", ""], home, hub.url))
    assert first == {"task": "causal_lm", "name": "tiny/llama", "tokens": first["tokens"], "layers": 2}
    downloads = [r for r in hub.requests if r.startswith("GET /tiny/llama/resolve/")]
    assert any(r.endswith("/model.safetensors") for r in downloads)
    snapshots = home / "hub" / "models--tiny--llama" / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [MAIN]
    seen = len(hub.requests)
    # the cache serves it with the hub unreachable by rule
    assert _loaded(_run(["tiny/llama", ""], home, hub.url, offline=True))["layers"] == 2
    assert len(hub.requests) == seen
    # a revision is honoured: a branch (named as every command's --model takes it), then its
    # commit, each with its own weights
    assert _loaded(_run(["tiny/llama@v1", ""], home, hub.url))["layers"] == 1
    assert _loaded(_run(["tiny/llama", OLD], home, hub.url, offline=True))["layers"] == 1
    assert sorted(p.name for p in snapshots.iterdir()) == sorted([MAIN, OLD])


@pytest.mark.parametrize(
    ("repo", "says", "names"),
    [
        ("tiny/pickled", "has only pickled weights (pytorch_model.bin)", "--allow-pickle"),
        ("tiny/gated", "is a gated repository", "hf auth login"),
        ("tiny/corrupt", "the download of model.safetensors from tiny/corrupt is corrupt", "run the same command again"),
        ("tiny/custom-code", "runs its own Python code", "--trust-remote-code"),
        ("tiny/missing", "no model repository 'tiny/missing'", "hf auth login"),
    ],
)
def test_what_cannot_load_safely_is_one_line(hub, tmp_path, repo, says, names):
    done = _run(["explain", "The capital of France is", "--model", repo, "--method", "saliency"], tmp_path / "hf", hub.url, cli=True)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and says in lines[0] and names in lines[1], done.stderr
    assert "Traceback" not in done.stderr
    if repo == "tiny/pickled":
        assert not any(r.endswith(".bin") for r in hub.requests if r.startswith("GET"))
    if repo == "tiny/corrupt":  # the corrupt file is not left in the cache to be served later
        assert not list((tmp_path / "hf" / "hub").rglob("model.safetensors"))


def test_an_unreachable_hub_is_one_line_within_ten_seconds(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    fetched = _loaded(_run(["tiny/llama"], tmp_path / "hf", closed, script=FETCH))
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
m = heedful.load(sys.argv[1], revision=sys.argv[2], progress=False)
print(json.dumps([float(s) for s in m.explain("The capital of France is", "saliency").scores]))
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
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
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
    pinned = json.loads(_run(["tiny/llama", OLD], home, hub.url, offline=True, script=SCORES).stdout.strip().splitlines()[-1])
    assert served == pytest.approx(pinned, rel=1e-5, abs=1e-7)
    latest = json.loads(_run(["tiny/llama", MAIN], home, hub.url, script=SCORES).stdout.strip().splitlines()[-1])
    assert served != pytest.approx(latest, rel=1e-3, abs=1e-5)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--revision", "v1"], "no --model is given"),
        (["--model", "tiny/llama", "--model", "tiny/other", "--revision", "v1"], "pins one hub model, and 2 are given"),
        (["--model", "minilm-sentiment", "--revision", "v1"], "is for hub ids"),
        (["--model", "tiny/llama@v1", "--revision", "v2"], "names a revision and revision='v2' another"),
    ],
)
def test_serve_hub_flags_that_cannot_apply_are_one_line(tmp_path, args, says):
    with socket.socket() as sock:  # no hub: each is refused before any download
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    done = _run(["serve", *args, "--port", str(_free_port())], tmp_path / "hf", closed, cli=True)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and says in lines[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("repo", "names"), [("tiny/pickled", "--allow-pickle"), ("tiny/custom-code", "--trust-remote-code")])
def test_serve_refuses_what_cannot_load_safely_in_one_line(hub, tmp_path, repo, names):
    done = _run(["serve", "--model", repo, "--port", str(_free_port())], tmp_path / "hf", hub.url, cli=True)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and names in lines[1] and "Traceback" not in done.stderr, done.stderr


def test_serve_passes_allow_pickle_to_the_hub_path(hub, tmp_path):
    done = _run(["serve", "--model", "tiny/pickled", "--allow-pickle", "--port", str(_free_port())], tmp_path / "hf", hub.url, cli=True)
    # allowed, the pickle is downloaded and handed to transformers (which finds no model in it)
    assert done.returncode == 2 and "cannot load the weights of tiny/pickled" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert any(r.endswith("/pytorch_model.bin") for r in hub.requests if r.startswith("GET"))
