"""The warm worker: a background process that holds torch, transformers and heedful imported
and the models it loaded, and runs the command lines :mod:`heedful.launch` sends it over a
Unix socket private to this user -- ``heedful explain`` then takes the time of the
explanation, not of the imports (~6 CPU-seconds) and the model's loading.

One command runs at a time; others wait in the socket's queue. Each runs as it would in its own
process: the client's arguments, working directory, environment and terminal (which streams are
terminals, the size, the encoding), its stdout and stderr streamed back frame by frame, its exit
code returned; a Ctrl-C at the client interrupts the job as SIGINT would. The worker exits after
an idle timeout, on SIGTERM (``heedful warm --stop``), or when a client runs other code (another
:func:`heedful.warm.channel.code_key`), which then starts a fresh one. Started by
:mod:`heedful.warm.client` as ``python -c "from heedful.worker import main; main()" MINUTES``.
"""

from __future__ import annotations

import _thread
import fcntl
import io
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path

from heedful.warm import channel

KEPT_MODELS = 2
"""Loaded models a worker keeps (the least recently used goes first)."""


class Stopped(BaseException):
    """SIGTERM: the worker stops, also mid-command."""


class Relay:
    """``sys.stdout`` / ``sys.stderr`` of the worker: writes go to the running job's stream, or to
    the log between jobs -- also for whatever took the stream at import time (loggers)."""

    def __init__(self, fallback) -> None:
        self.fallback = self.target = fallback

    def __getattr__(self, name: str):
        return getattr(self.target, name)

    def write(self, text: str) -> int:
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()


class JobStream:
    """One of the job's output streams: text encoded as the client's stream encodes it, sent as
    frames of ``kind``; ``isatty`` answers for the client's stream. A client that went away is
    written to no more."""

    def __init__(self, conn: socket.socket, kind: bytes, tty: bool, encoding: str, errors: str, lock: threading.Lock) -> None:
        self.conn, self.kind, self.tty, self.encoding, self.errors, self.lock = conn, kind, tty, encoding, errors, lock
        self.closed, self.gone = False, False
        self.buffer = self

    def write(self, data: str | bytes) -> int:
        raw = data if isinstance(data, bytes) else data.encode(self.encoding, self.errors)
        if raw and not self.gone:
            try:
                with self.lock:
                    channel.send(self.conn, self.kind, raw)
            except OSError:
                self.gone = True
        return len(data)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the job's stream is a socket relay")


class Worker:
    """The serving loop and what it keeps between commands."""

    def __init__(self, idle_minutes: float, files: dict[str, Path], key: str) -> None:
        self.idle_minutes, self.files, self.key = idle_minutes, files, key
        self.jobs, self.since = 0, time.time()
        self.running = threading.Event()
        self.guard = threading.Lock()
        self.stdout, self.stderr = Relay(sys.stdout), Relay(sys.stderr)

    def state(self) -> dict:
        from heedful.commands import console

        return {
            "pid": os.getpid(), "key": self.key, "idle_minutes": self.idle_minutes, "jobs": self.jobs,
            "since": self.since, "models": [k[0] for k in (console.kept_models or {})], "socket": str(self.files["socket"]),
        }

    def warm_up(self) -> None:
        """Import what a command needs: the command line, torch, transformers' model code, the
        loading code, the methods and the views."""
        sys.stdout, sys.stderr = self.stdout, self.stderr
        import torch  # noqa: F401
        import transformers.modeling_utils  # noqa: F401

        import heedful
        import heedful.cli  # noqa: F401
        import heedful.loading  # noqa: F401
        import heedful.render.html  # noqa: F401
        import heedful.render.terminal  # noqa: F401
        from heedful.commands import console

        heedful.methods()
        self.fresh = torch.get_rng_state(), torch.get_num_threads()  # a new process's, before any job
        console.kept_models = {}
        console.KEEP_MODELS = KEPT_MODELS

    def serve(self, server: socket.socket) -> None:
        server.settimeout(self.idle_minutes * 60)
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                print(f"idle for {self.idle_minutes:g} min: exiting", file=sys.stderr)
                return
            with conn:
                try:
                    if not self._same_user(conn):
                        continue
                    if not self._handle(conn):
                        return
                except KeyboardInterrupt:  # a Ctrl-C that arrived as its job ended
                    pass
                except OSError as exc:
                    print(f"connection failed: {exc}", file=sys.stderr)

    @staticmethod
    def _same_user(conn: socket.socket) -> bool:
        if not hasattr(socket, "SO_PEERCRED"):
            return True  # the socket is 0600 in a 0700 folder
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return uid == os.getuid()

    def _handle(self, conn: socket.socket) -> bool:
        """One connection; ``False`` when the worker must stop (a client runs other code)."""
        conn.settimeout(10.0)
        frame = channel.receive(conn)
        conn.settimeout(None)
        if frame is None or frame[0] != channel.HELLO:
            return True
        hello = json.loads(frame[1])
        if hello.get("ask"):
            failed = {name: problem for name in hello.get("load", []) if (problem := self._preload(name))}
            channel.send(conn, channel.ACCEPTED, json.dumps({**self.state(), "failed": failed}).encode())
            return True
        if hello.get("key") != self.key:
            channel.send(conn, channel.REFUSED, json.dumps({"reason": "the worker runs other code"}).encode())
            return False
        channel.send(conn, channel.ACCEPTED, json.dumps(self.state()).encode())
        self.jobs += 1
        code = self._job(conn, hello)
        channel.send(conn, channel.EXIT, json.dumps(code).encode())
        return True

    def _preload(self, name: str) -> str | None:
        """Load the model ``name`` into the kept models; what went wrong, if anything."""
        from heedful.commands.console import load_model
        from heedful.errors import HeedfulError

        try:
            load_model(name)
        except HeedfulError as exc:
            return exc.message + (f" ({exc.cli_hint})" if exc.cli_hint else "")
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _job(self, conn: socket.socket, hello: dict) -> int:
        """Run the command line of ``hello`` as its own process would, in this one: also with a
        new process's torch generator and thread count (``heedful bench --threads`` sets it)."""
        import torch

        from heedful.commands import console

        torch.set_rng_state(self.fresh[0])

        saved = dict(os.environ), os.getcwd(), sys.argv, sys.stdin
        main = sys.modules["__main__"]
        package = getattr(main, "__package__", None)
        lock = threading.Lock()
        tty, size = hello["tty"], hello.get("size")
        streams = [JobStream(conn, kind, tty[i + 1], hello["encoding"][i], hello["errors"][i], lock) for i, kind in enumerate((channel.STDOUT, channel.STDERR))]
        try:
            os.environ.clear()
            os.environ.update(hello["env"])
            if size and "COLUMNS" not in os.environ:  # where the client's terminal size is read, rich and shutil read these
                os.environ["COLUMNS"], os.environ["LINES"] = str(size[0]), str(size[1])
            os.chdir(hello["cwd"])
            sys.argv = [hello["argv0"], *hello["args"]]
            main.__package__ = hello["package"]  # how click names the program: `heedful` or `python -m heedful`
            sys.stdin = _EmptyInput(tty[0])
            self.stdout.target, self.stderr.target = streams
            console.out.__init__()  # rich reads the terminal's kind, colours and width when made
            console.err.__init__(stderr=True)
            listener = threading.Thread(target=self._listen, args=(conn,), daemon=True)
            with self.guard:
                self.running.set()
            listener.start()
            try:
                return _run_command_line()
            finally:
                with self.guard:
                    self.running.clear()
        except OSError as exc:  # the client's working directory is gone
            streams[1].write(f"error: {exc}\n")
            return 2
        finally:
            for stream in (self.stdout, self.stderr):
                stream.target.flush()
                stream.target = stream.fallback
            torch.set_num_threads(self.fresh[1])
            environ, cwd, sys.argv, sys.stdin = saved
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(cwd)
            main.__package__ = package
            console.out.__init__()
            console.err.__init__(stderr=True)

    def _listen(self, conn: socket.socket) -> None:
        """Ctrl-C from the client, or the client gone: interrupt the running job as SIGINT would."""
        while True:
            try:
                frame = channel.receive(conn)
            except OSError:
                frame = None
            if frame is None or frame[0] == channel.INTERRUPT:
                with self.guard:
                    if self.running.is_set():
                        _thread.interrupt_main(signal.SIGINT)
            if frame is None or not self.running.is_set():
                return


class _EmptyInput(io.StringIO):
    """The job's stdin: empty (commands that read stdin run in the client's process)."""

    def __init__(self, tty: bool) -> None:
        super().__init__("")
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _run_command_line() -> int:
    """:func:`heedful.cli.main`, its exit code as a process would have it."""
    from heedful.cli import main

    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Stopped:
        raise
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    """Run a worker for this checkout until idle (``sys.argv[1]``: minutes; ``sys.argv[2]``: the
    key of the client that started it), unless one runs."""
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    key = sys.argv[2] if len(sys.argv) > 2 else channel.code_key()
    files = channel.paths(channel.ensure_private(channel.run_dir()))
    with open(files["lock"], "a") as lock:
        deadline = time.monotonic() + 5.0  # a worker refusing other code is on its way out
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return  # another worker runs (or starts) for this checkout
                time.sleep(0.1)
        worker = Worker(idle, files, key)

        def stop(signum, frame):
            raise Stopped

        signal.signal(signal.SIGTERM, stop)
        try:
            worker.warm_up()
            files["socket"].unlink(missing_ok=True)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            mask = os.umask(0o177)  # the socket is made 0600: this user only
            try:
                server.bind(str(files["socket"]))
            finally:
                os.umask(mask)
            server.listen(16)
            files["pid"].write_text(str(os.getpid()))
            print(f"heedful worker {os.getpid()} ready on {files['socket']} (idle timeout {idle:g} min)", file=sys.stderr)
            with server:
                worker.serve(server)
        except Stopped:
            print("stopped (SIGTERM)", file=sys.stderr)
        finally:
            files["socket"].unlink(missing_ok=True)
            files["pid"].unlink(missing_ok=True)
