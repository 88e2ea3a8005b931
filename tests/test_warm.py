"""The warm worker (heedful/worker.py, heedful/warm/, heedful/launch.py): a command sent to it
prints exactly what it prints in its own process -- stdout, stderr, exit code, colours and width
included -- its Ctrl-C stops the job with the usual line and exit 130 and the worker serves on,
a worker running other code is replaced, and the socket is used only when it is this user's
alone (0600) and alive."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import saved_tiny

from heedful.warm import channel, client

ROOT = Path(__file__).resolve().parents[1]
BOUND = 240.0  # seconds: a bound for a broken run only
TEXT = "a charming and often affecting journey"
pytestmark = pytest.mark.skipif(not channel.available() or sys.platform != "linux", reason="Unix sockets and SO_PEERCRED")


def _heedful(env: dict, *args: str, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "heedful", *args], env=env, capture_output=True, timeout=BOUND, **extra)


def _timeless(output: bytes) -> str:
    """``output`` without the wall seconds JSON records (which differ from run to run)."""
    return re.sub(r'"seconds": [0-9.e+-]+', '"seconds": ...', output.decode())


def _lasting(output: bytes) -> str:
    """``output`` without the frames of the transient "loading ..." spinner (each line erased
    by the next), whose number depends on how long the loading took -- and which the worker
    does not show for a model it holds."""
    text = re.sub(r"\x1b\[\?25[lh]", "", output.decode())
    text = re.sub(r"[^\r\n]*\r\x1b\[2K", "", text).replace("\r", "")
    return re.sub(r"(?m)^\S* loading .* …\n", "", re.sub(r"\x1b\[[0-9;]*m", "", text))


def _jobs(env: dict) -> int:
    shown = _heedful(env, "warm", "--status").stdout.decode()
    found = re.search(r"(\d+) command\(s\) run", shown)
    assert found, shown
    return int(found.group(1))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A worker for this checkout with a tiny saved model loaded; ``(env, model folder)``."""
    folder = tmp_path_factory.mktemp("warm")
    model = saved_tiny(folder / "tiny-bert", "bert", "classification")
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "HEEDFUL_WARM_IDLE": "10", "HEEDFUL_WARM": "auto",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    env.pop("COLUMNS", None)
    started = _heedful(env, "warm", "--model", model)
    assert started.returncode == 0, started.stderr.decode()[-2000:]
    yield env, model
    _heedful(env, "warm", "--stop")


@pytest.mark.parametrize(
    "args, extra_env",
    [
        (["explain", TEXT], {}),
        # JSON and a terminal's colours and width: in the slow suite (a cold process each, ~16 s on 2 cores)
        pytest.param(["explain", TEXT, "--method", "saliency", "--method", "integrated_gradients", "-o", "n_steps=8", "--json"], {},
                     marks=pytest.mark.slow),
        pytest.param(["explain", TEXT, "--words"], {"FORCE_COLOR": "1", "COLUMNS": "60"}, marks=pytest.mark.slow),
        (["explain", TEXT, "--method", "integrated_gradient"], {}),  # an error: one line, exit 2
        (["methods", "integrated_gradients"], {}),
    ],
    ids=["heatmap", "json", "colours", "error", "methods"],
)
def test_a_command_prints_the_same_through_the_worker_and_in_its_own_process(warm, args, extra_env):
    env, model = warm
    args = [*args, "--model", model] if args[0] == "explain" else args
    before = _jobs(env)
    through = _heedful({**env, **extra_env}, *args)
    assert _jobs(env) == before + 1  # it ran in the worker
    alone = _heedful({**env, **extra_env, "HEEDFUL_WARM": "never"}, *args)
    assert (through.returncode, _timeless(through.stdout), _lasting(through.stderr)) == (alone.returncode, _timeless(alone.stdout), _lasting(alone.stderr))
    assert through.stdout or through.stderr
    if "colours" in str(extra_env) or extra_env.get("FORCE_COLOR"):
        assert b"\x1b[" in through.stdout and max(len(line) for line in re.sub(rb"\x1b\[[0-9;]*m", b"", through.stdout).splitlines()) <= 60


def test_ctrl_c_stops_the_job_in_the_worker_which_serves_on(warm, tmp_path):
    """SIGINT to the command line reaches its job in the worker: the usual line, exit 130, no
    traceback; the worker then runs the next command."""
    env, model = warm
    err = tmp_path / "explain.err"
    args = ["explain", TEXT, "--model", model, "--method", "integrated_gradients", "-o", "n_steps=400000", "-o", "rule=riemann_trapezoid", "--progress"]
    before = _jobs(env)
    with open(err, "wb") as e:
        process = subprocess.Popen([sys.executable, "-m", "heedful", *args], env=env, stdout=subprocess.DEVNULL, stderr=e)
    deadline = time.monotonic() + BOUND
    while process.poll() is None and time.monotonic() < deadline and "passes over" not in err.read_text():
        time.sleep(0.05)  # the work has started
    time.sleep(0.5)
    assert process.poll() is None, err.read_text()[-2000:]
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=BOUND) == 130
    text = err.read_text()
    assert "Traceback" not in text, text[-2000:]
    assert text.rstrip().splitlines()[-1] == "interrupted (Ctrl-C): stopped before the end; nothing more was written"
    assert _jobs(env) == before + 1
    after = _heedful(env, "explain", TEXT, "--model", model)
    assert after.returncode == 0 and TEXT.split()[1] in after.stdout.decode()
    assert _jobs(env) == before + 2


def _closed_reader(env: dict, *args: str) -> tuple[int, str]:
    """Exit code and stderr of ``heedful ARGS`` whose reader has gone (``heedful ... | true``)."""
    process = subprocess.Popen([sys.executable, "-m", "heedful", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, err = process.communicate(timeout=BOUND)
    return process.returncode, err.decode()


def test_a_reader_that_goes_away_ends_the_command_as_in_its_own_process(warm):
    """``heedful methods | true``: no traceback from the relay, the exit code of its own process."""
    env, _ = warm
    before = _jobs(env)
    through = _closed_reader(env, "methods")
    assert _jobs(env) == before + 1
    assert through == _closed_reader({**env, "HEEDFUL_WARM": "never"}, "methods")
    assert "Traceback" not in through[1]


def test_heedful_warm_says_which_model_it_could_not_load(warm):
    env, model = warm
    done = _heedful({**env, "HF_HUB_OFFLINE": "1"}, "warm", "--model", model, "--model", "no-such-model")
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 0 and any(line.startswith("warning: no-such-model was not loaded: ") for line in lines), lines


@pytest.mark.slow  # starts a second worker and waits for it, about 40 s on 2 cores: run with -m slow
def test_a_model_command_starts_a_worker_after_it_for_the_next_ones(warm, tmp_path):
    """With none running, ``heedful explain`` runs in its own process and leaves a worker (here
    off a terminal: ``HEEDFUL_WARM=always``) that the next command uses; ``--no-warm`` starts
    none."""
    env, model = warm
    home = tmp_path / "h"
    for name in ("models", "data", "downloads"):  # the zoo's built models, as the suite's home
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(Path(env["HEEDFUL_HOME"]) / name, target_is_directory=True)
    fresh = {**env, "HEEDFUL_HOME": str(home), "HEEDFUL_WARM": "always"}
    fresh.pop("XDG_RUNTIME_DIR", None)
    files = channel.paths(home / "run")
    try:
        assert _heedful(fresh, "explain", TEXT, "--model", model, "--no-warm").returncode == 0
        time.sleep(1.0)
        assert client.running_pid(files) is None
        first = _heedful(fresh, "explain", TEXT, "--model", model)
        assert first.returncode == 0 and not first.stderr
        assert client.wait_ready(None, files, timeout=BOUND) is not None
        again = _heedful(fresh, "explain", TEXT, "--model", model)
        assert (again.returncode, again.stdout) == (0, first.stdout)
        assert _jobs(fresh) == 1
    finally:
        client.stop(files)


def test_the_socket_and_its_folder_are_this_users_alone(warm):
    env, _ = warm
    found = _heedful(env, "warm", "--status").stdout.decode()
    path = Path(re.search(r"socket (\S+)", found).group(1))
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == os.getuid()
    assert path.parent.stat().st_mode & 0o777 == 0o700


def _files(folder: Path) -> dict[str, Path]:
    return {kind: folder / f"w.{kind}" for kind in ("socket", "lock", "pid", "log")}


def test_a_socket_others_may_use_is_not_used(tmp_path):
    files = _files(tmp_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(files["socket"]))
    server.listen(1)
    with server:
        os.chmod(files["socket"], 0o666)
        assert client.connect(files) is None
        assert files["socket"].exists()  # someone's socket: left alone
        os.chmod(files["socket"], 0o600)
        found = client.connect(files)
        assert found is not None
        found.close()


def test_a_stale_socket_is_removed_and_the_command_runs_in_its_own_process(tmp_path):
    files = _files(tmp_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(files["socket"]))
    os.chmod(files["socket"], 0o600)
    server.close()  # the worker died without removing it
    assert client.run(["methods"], files) is None
    assert not files["socket"].exists()


def test_the_key_changes_with_the_source_and_the_import_time_environment(tmp_path, monkeypatch):
    package = tmp_path / "heedful"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    first = channel.code_key(package)
    assert channel.code_key(package) == first
    (package / "a.py").write_text("x = 22\n")
    assert channel.code_key(package) != first
    second = channel.code_key(package)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    assert channel.code_key(package) != second


@pytest.mark.slow  # starts a replacement worker, about 30 s on 2 cores: run with -m slow
def test_a_worker_running_other_code_is_replaced(warm):
    """A client whose key differs (here: an import-time variable) is refused; the command runs
    in its own process and a fresh worker takes the old one's place. (Last: it replaces the
    module's worker.)"""
    env, model = warm
    old = int(re.search(r"pid (\d+)", _heedful(env, "warm", "--status").stdout.decode()).group(1))
    other = {**env, "HF_HEEDFUL_WARM_TEST": "1"}
    done = _heedful(other, "explain", TEXT, "--model", model)
    alone = _heedful({**other, "HEEDFUL_WARM": "never"}, "explain", TEXT, "--model", model)
    assert (done.returncode, done.stdout) == (0, alone.stdout)
    files = channel.paths(channel.run_dir())
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline and (client.running_pid(files) in (None, old)):
        time.sleep(0.2)
    assert client.running_pid(files) not in (None, old)
    state = client.wait_ready(None, files, timeout=BOUND)
    assert state is not None and state["pid"] != old


def test_a_wrong_idle_timeout_is_one_line(tmp_path):
    env = {**os.environ, "HEEDFUL_HOME": str(tmp_path), "HEEDFUL_WARM_IDLE": "abc", "PYTHONPATH": str(ROOT)}
    done = _heedful(env, "warm")
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == ["error: HEEDFUL_WARM_IDLE must be a number of minutes, got 'abc'", "hint: e.g. HEEDFUL_WARM_IDLE=15, or unset it"]
    assert client.running_pid(channel.paths(tmp_path / "run")) is None
