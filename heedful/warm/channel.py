"""What the command line and the warm worker share: the socket's place, the key that says
whether a worker runs this very code, and the frames they exchange.

A frame is one byte of kind, four bytes of length (big-endian) and the payload. The client
sends ``HELLO`` (a JSON request) and later ``INTERRUPT`` (Ctrl-C); the worker answers
``ACCEPTED`` (the job starts; JSON of the worker's state), then ``STDOUT`` / ``STDERR`` bytes as
the command writes them and ``EXIT`` (the exit code, JSON), or ``REFUSED`` (JSON ``{"reason"}``:
the worker runs other code and stops).
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import sys
from pathlib import Path

HELLO, INTERRUPT = b"h", b"i"
ACCEPTED, STDOUT, STDERR, EXIT, REFUSED = b"a", b"o", b"e", b"x", b"r"
PACKAGE = Path(__file__).resolve().parent.parent
"""The heedful package this code belongs to (one worker per checkout and interpreter)."""
IMPORT_TIME_ENV = ("HF_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "TOKENIZERS_", "CUDA_", "PYTHON")
"""Prefixes of environment variables read when torch and transformers are imported: a worker
started under other values would run differently, so they are part of its key."""
MAX_PATH = 100
"""Longest socket path (the system's limit is 104-108 bytes)."""


class Unsafe(Exception):
    """The socket or its folder could be someone else's: not used."""


def available() -> bool:
    """Whether this system has Unix sockets (and so a warm worker)."""
    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def run_dir() -> Path:
    """The folder of the worker's socket, lock, pid and log files, private to this user (0700):
    ``$XDG_RUNTIME_DIR/heedful`` when that is set, else ``run/`` in the heedful home."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "heedful"
    from heedful.files.cache import heedful_home

    return heedful_home() / "run"


def ensure_private(folder: Path) -> Path:
    """``folder``, created 0700 if missing; :class:`Unsafe` if it is not this user's or others
    may write in it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise Unsafe(f"{folder} is not a private folder of this user")
    return folder


def checkout_id() -> str:
    """Which worker a command line may use: one per heedful package and interpreter."""
    return hashlib.sha256(f"{PACKAGE}\0{os.path.realpath(sys.executable)}".encode()).hexdigest()[:12]


def paths(folder: Path | None = None) -> dict[str, Path]:
    """The worker's ``socket``, ``lock``, ``pid`` and ``log`` files for this checkout (in a
    private folder of the system's temporary one when ``folder`` is too deep for a socket)."""
    base = (folder or run_dir()) / f"warm-{checkout_id()}"
    if len(str(base.with_suffix(".socket"))) > MAX_PATH:
        import tempfile

        base = ensure_private(Path(tempfile.gettempdir()) / f"heedful-{os.getuid()}") / base.name
    return {kind: base.with_suffix(f".{kind}") for kind in ("socket", "lock", "pid", "log")}


def check_socket(path: Path) -> None:
    """:class:`Unsafe` unless ``path`` is a socket of this user that only this user may use."""
    found = path.lstat()
    if not stat.S_ISSOCK(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise Unsafe(f"{path} is not a socket only this user may use")


def code_key(package: Path = PACKAGE) -> str:
    """What must be equal for a worker to run a command as this process would: heedful's
    version and source files (path, size, modification time), the interpreter, and the
    environment read at import time (:data:`IMPORT_TIME_ENV`)."""
    from heedful.version import __version__

    digest = hashlib.sha256(f"{__version__}\0{os.path.realpath(sys.executable)}\0{sys.version}".encode())
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".json")):
                found = os.stat(os.path.join(root, name))
                digest.update(f"{os.path.relpath(os.path.join(root, name), package)}\0{found.st_size}\0{found.st_mtime_ns}\0".encode())
    for name in sorted(os.environ):
        if name.startswith(IMPORT_TIME_ENV) and not name.startswith("PYTHONUNBUFFERED"):
            digest.update(f"{name}={os.environ[name]}\0".encode())
    return digest.hexdigest()[:16]


def send(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(kind + len(payload).to_bytes(4, "big") + payload)


def receive(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The next frame ``(kind, payload)``, or ``None`` when the other end closed."""
    head = _exactly(sock, 5)
    if head is None:
        return None
    payload = _exactly(sock, int.from_bytes(head[1:], "big"))
    return None if payload is None else (head[:1], payload)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
