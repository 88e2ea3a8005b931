"""Ctrl-C stops every command at once and says so: a backward pass is interruptible mid-pass
(PyTorch's autograd engine otherwise runs a whole pass in C++ before Python can raise the
``KeyboardInterrupt``: a Ctrl-C during a large chunk's backward waited 9-13 s on a 135M-parameter
decoder), and ``heedful explain`` stopped by SIGINT prints one line and exits 130 (typer turned
the interrupt into a silent exit 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import saved_tiny

from heedful import interrupt
from heedful.interrupt import interruptible

ROOT = Path(__file__).resolve().parents[1]
BOUND = 240.0  # seconds: a bound for a broken run only


class _InterruptOnBackward(torch.autograd.Function):
    """Identity; its backward (the first node of the pass) has another thread send SIGINT to
    this process 50 ms later, while the rest of the pass runs in C++ (the engine holds no GIL
    there)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGINT)).start()  # once the pass is back in C++
        return grad


def _long_pass(layers: int = 48, width: int = 512, rows: int = 512):
    """A leaf and a loss whose backward is ``layers`` residual blocks of matrix products (about
    a second on one core): far longer than another thread takes to send a signal."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=gen, requires_grad=True)
    weights = [torch.randn(width, width, generator=gen) / width**0.5 for _ in range(layers)]
    h = x
    for w in weights:
        h = h + torch.tanh(h @ w)
    return x, _InterruptOnBackward.apply(h).sum()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread only")
def test_a_ctrl_c_lands_during_the_backward_pass():
    """With :func:`interruptible`, the interrupt sent as the pass begins stops it: the leaf never
    receives its gradient (without, the whole pass ran before the KeyboardInterrupt)."""
    x, loss = _long_pass()
    with pytest.raises(KeyboardInterrupt):
        interruptible(loss).backward()
        time.sleep(5)  # (without it: the interrupt arrives after the pass, here at the latest)
    assert x.grad is None, "the backward pass ran to its end before the interrupt"


def test_the_adapters_backward_enters_python_at_every_node(tiny, monkeypatch):
    """Every gradient method's backward (``ModelAdapter.grad``) runs the interrupt check at each
    node of the graph; the scores are those of a plain backward."""
    import heedful.adapters.passes as passes

    calls = []
    monkeypatch.setattr(interrupt, "_check", lambda grads: calls.append(1))
    model = tiny("bert")
    hooked = model.explain("a charming and often affecting journey", "integrated_gradients", n_steps=8)
    assert len(calls) > 20  # one per node: embeddings, every layer's products, the head
    monkeypatch.setattr(passes, "interruptible", lambda output: output)
    plain = model.explain("a charming and often affecting journey", "integrated_gradients", n_steps=8)
    assert hooked.scores.tolist() == plain.scores.tolist()


def test_interruptible_leaves_a_tensor_without_a_graph_alone():
    t = torch.ones(3)
    assert interruptible(t) is t


def test_heedful_explain_stopped_by_sigint_says_so_and_exits_130(tmp_path):
    """``heedful explain`` with a long integrated-gradients run, SIGINT once it is computing:
    one line on stderr, exit code 130, no traceback."""
    model = saved_tiny(tmp_path / "tiny-bert", "bert", "classification")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    err = tmp_path / "explain.err"
    args = ["explain", "a charming and often affecting journey", "--model", model, "--method", "integrated_gradients",
            "-o", "n_steps=400000", "-o", "rule=riemann_trapezoid", "--progress"]
    with open(err, "wb") as e:
        process = subprocess.Popen([sys.executable, "-m", "heedful", *args], env=env, stdout=subprocess.DEVNULL, stderr=e)
    deadline = time.monotonic() + BOUND
    started = ("estimated on this machine", "passes over")  # the long run announced, or its first progress
    while process.poll() is None and time.monotonic() < deadline and not any(s in err.read_text() for s in started):
        time.sleep(0.05)  # the model is loaded, the work starts
    time.sleep(0.5)
    assert process.poll() is None, err.read_text()[-2000:]
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=BOUND) == 130
    text = err.read_text()
    assert "Traceback" not in text, text[-2000:]
    assert text.rstrip().splitlines()[-1] == "interrupted (Ctrl-C): stopped before the end; nothing more was written"


class _InterruptedWhileMade:
    """A class attribute whose ``__set_name__`` receives Ctrl-C, as a dataclass field of a
    module imported when Ctrl-C came: Python 3.11 wraps that KeyboardInterrupt in a RuntimeError."""

    def __set_name__(self, owner, name):
        signal.raise_signal(signal.SIGINT)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread only")
def test_an_interrupt_wrapped_by_python_still_exits_130_with_the_line(monkeypatch, capsys):
    """Ctrl-C while a module is imported (a class being made) reaches the command line as a
    RuntimeError: it is still an interrupt -- the line and exit 130, no traceback."""
    from conftest import run_cli

    from heedful import cli

    def loading(*args, **kwargs):
        class Roles:  # noqa: F841  (made as a module's class would be, mid-import)
            field = _InterruptedWhileMade()

    monkeypatch.setattr(cli, "load_model", loading)
    code, _, err = run_cli(monkeypatch, capsys, "explain", "a charming journey")
    assert code == 130
    assert err.rstrip().splitlines()[-1] == "interrupted (Ctrl-C): stopped before the end; nothing more was written"
