"""The command line's end of the warm worker (standard library only): run a command in a
running worker, relaying its output and exit code; start, ask and stop a worker.

:func:`run` sends the command line, the working directory, the environment and what the
terminal is (which streams are terminals, its size, the output encoding), so that the worker
prints exactly what this process would; Ctrl-C here is sent on to the worker's job. Whenever the
worker cannot be used -- none running, a stale socket, a socket not private to this user, a
worker running other code -- :func:`run` returns ``None`` and the command runs in this process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from heedful.warm import channel

IDLE_MINUTES = 15.0
"""How long a worker waits for a command before it exits (``HEEDFUL_WARM_IDLE``, minutes)."""


def idle_minutes() -> float:
    """The idle timeout: ``$HEEDFUL_WARM_IDLE`` minutes, else :data:`IDLE_MINUTES`."""
    try:
        return float(os.environ.get("HEEDFUL_WARM_IDLE", IDLE_MINUTES))
    except ValueError:
        return IDLE_MINUTES


def connect(files: dict[str, Path]) -> socket.socket | None:
    """A connection to this checkout's worker, or ``None``: no socket, a stale one (removed), or
    one this user does not own alone (left alone, not used)."""
    path = files["socket"]
    try:
        channel.check_socket(path)
    except (OSError, channel.Unsafe):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        _remove_stale(files)
        return None
    except OSError:
        sock.close()
        return None
    return sock


def _remove_stale(files: dict[str, Path]) -> None:
    """Remove a socket nobody listens on -- unless a worker holds the lock (it is binding it)."""
    import fcntl

    try:
        with open(files["lock"], "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            files["socket"].unlink(missing_ok=True)
    except OSError:
        pass


def _terminal() -> dict:
    """What the worker needs to print as this process would: which of stdin, stdout and stderr
    are terminals, the terminal's size (looked up on the three as rich does), the encodings."""
    size = None
    for fd in (0, 1, 2):
        try:
            size = list(os.get_terminal_size(fd))
            break
        except (OSError, ValueError, AttributeError):
            continue
    streams = (sys.stdin, sys.stdout, sys.stderr)
    return {
        "tty": [bool(s is not None and s.isatty()) for s in streams],
        "size": size,
        "encoding": [getattr(s, "encoding", None) or "utf-8" for s in streams[1:]],
        "errors": [getattr(s, "errors", None) or "strict" for s in streams[1:]],
    }


REFUSED = "refused"
"""What :func:`run` returns when the worker runs other code (it stops; start another)."""


def run(args: list[str], files: dict[str, Path] | None = None) -> int | str | None:
    """Run ``heedful ARGS`` in this checkout's worker and return its exit code, having written
    its output here; ``None`` when no usable worker runs, :data:`REFUSED` when it runs other
    code (nothing was run either way). Ctrl-C is sent to the job, which stops as it would here
    (what it computed is kept)."""
    files = files or channel.paths()
    sock = connect(files)
    if sock is None:
        return None
    main = sys.modules.get("__main__")
    hello = {
        "args": args, "argv0": sys.argv[0], "package": getattr(main, "__package__", None),
        "cwd": os.getcwd(), "env": dict(os.environ), "key": channel.code_key(), **_terminal(),
    }
    with sock:
        try:
            channel.send(sock, channel.HELLO, json.dumps(hello).encode())
        except OSError:  # the worker went away before it read the request: nothing ran
            return None
        return _relay(sock)


def _relay(sock: socket.socket) -> int | str | None:
    """Write the job's output as it comes, send Ctrl-C on; the exit code (or :data:`REFUSED`)."""
    started = False

    def interrupt(signum, frame):
        if not started:  # still queued behind another command: leave the queue
            raise KeyboardInterrupt
        try:
            channel.send(sock, channel.INTERRUPT)
        except OSError:
            pass

    previous = signal.signal(signal.SIGINT, interrupt) if _main_thread() else None
    try:
        while True:
            try:
                frame = channel.receive(sock)
            except KeyboardInterrupt:
                print("interrupted (Ctrl-C) while waiting for the warm worker; nothing was run", file=sys.stderr)
                return 130
            except OSError:  # the connection reset: as if closed
                frame = None
            if frame is None:
                if not started:
                    return None
                print("error: the warm worker stopped during the command (see `heedful warm --status`)", file=sys.stderr)
                return 1
            kind, payload = frame
            if kind == channel.ACCEPTED:
                started = True
            elif kind == channel.REFUSED:
                return REFUSED
            elif kind in (channel.STDOUT, channel.STDERR):
                stream = sys.stdout if kind == channel.STDOUT else sys.stderr
                try:
                    stream.flush()
                    stream.buffer.write(payload)
                    stream.buffer.flush()
                except BrokenPipeError:  # `heedful ... | head`: the reader has what it wanted
                    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # no flush error at exit
                    return 1  # the job sees the connection close and stops
            elif kind == channel.EXIT:
                return int(json.loads(payload))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def ask(files: dict[str, Path] | None = None, timeout: float = 2.0, **request) -> dict | None:
    """The worker's state (``{"pid", "key", "idle_minutes", "models", "jobs", "since"}``), or
    ``None`` when none answers within ``timeout`` seconds (none runs, or it is busy)."""
    sock = connect(files or channel.paths())
    if sock is None:
        return None
    with sock:
        sock.settimeout(timeout)
        try:
            channel.send(sock, channel.HELLO, json.dumps({"ask": True, **request}).encode())
            frame = channel.receive(sock)
        except OSError:
            return None
    return None if frame is None or frame[0] != channel.ACCEPTED else json.loads(frame[1])


def start(idle: float | None = None, files: dict[str, Path] | None = None) -> subprocess.Popen:
    """Start a worker for this checkout in the background, in its own session (Ctrl-C at the
    terminal does not reach it), its output to the log file; a second one started while one
    runs sees the lock and exits. It is given this process's key (its own environment differs
    in ``PYTHONPATH``, which leads it to this checkout)."""
    files = files or channel.paths(channel.ensure_private(channel.run_dir()))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(channel.PACKAGE.parent), env.get("PYTHONPATH")) if p)
    with open(files["log"], "ab") as log:
        os.chmod(files["log"], 0o600)
        return subprocess.Popen(
            [sys.executable, "-c", "from heedful.worker import main; main()", str(idle if idle is not None else idle_minutes()), channel.code_key()],
            cwd=files["socket"].parent, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )


def wait_ready(process: subprocess.Popen | None, files: dict[str, Path], timeout: float = 600.0) -> dict | None:
    """The started worker's state once it answers (``None``: it exited, or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ask(files)
        if found is not None:
            return found
        if process is not None and process.poll() is not None:
            return ask(files)  # another worker may have won the lock
        time.sleep(0.1)
    return None


def stop(files: dict[str, Path] | None = None, timeout: float = 10.0) -> int | None:
    """Stop this checkout's worker (SIGTERM, also mid-command); its pid, or ``None`` if none ran."""
    files = files or channel.paths()
    pid = running_pid(files)
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_worker(pid):
        time.sleep(0.05)
    return pid


def running_pid(files: dict[str, Path]) -> int | None:
    """The pid of this checkout's worker when one runs (busy or not), else ``None``."""
    try:
        pid = int(files["pid"].read_text())
    except (OSError, ValueError):
        return None
    return pid if _is_worker(pid) else None


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is a live heedful worker of this user (not a process that took the
    number of a dead one)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return b"heedful.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc to ask: the pid file's word is taken
    except OSError:
        return False
