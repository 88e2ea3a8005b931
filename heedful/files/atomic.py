"""Files and folders written whole: built beside their destination and renamed into place only
when complete, so a process stopped mid-write (or a write that raised) leaves the old version or
nothing — never half a file. Downloads, unpacked packages, zoo builds, cached data and parses,
archives and study units are written through here (the bench's SQLite store has its own transactions).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

PART_SUFFIX = ".part"
"""The last suffix of a file being written by :func:`atomic_file` (readers of a folder skip it)."""


@contextlib.contextmanager
def atomic_file(dest: str | Path) -> Iterator[Path]:
    """A fresh path beside ``dest`` to write; renamed onto ``dest`` when the block ends normally,
    deleted when it raises. The caller creates the file (so it gets the usual permissions).

    >>> import tempfile
    >>> dest = Path(tempfile.mkdtemp()) / "scores.json"
    >>> with atomic_file(dest) as part:
    ...     _ = part.write_text("[1, 2]", encoding="utf-8")
    ...     dest.exists()
    False
    >>> dest.read_text(encoding="utf-8"), [p.name for p in dest.parent.iterdir()]
    ('[1, 2]', ['scores.json'])
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:12]}{PART_SUFFIX}")  # unique: writers may race
    try:
        yield part
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(dest: str | Path) -> Iterator[Path]:
    """A fresh empty folder beside ``dest`` (named ``.<name>.tmp-*``) to fill; when the block ends
    normally it replaces ``dest`` (a previous ``dest`` is moved aside to ``.<name>.old-<pid>`` first
    and then deleted); when it raises, it is deleted and ``dest`` is untouched.

    Renaming onto a folder that another process created meanwhile raises :class:`OSError`; a caller
    that races others catches it and checks their copy.

    >>> import tempfile
    >>> dest = Path(tempfile.mkdtemp()) / "model"
    >>> with atomic_folder(dest) as folder:
    ...     _ = (folder / "weights.bin").write_bytes(b"w")
    >>> sorted(p.name for p in dest.iterdir()), [p.name for p in dest.parent.iterdir()]
    (['weights.bin'], ['model'])
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; it becomes an ordinary folder
    try:
        yield tmp
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_leftovers(dest: str | Path) -> None:
    """Delete what interrupted :func:`atomic_folder` blocks for ``dest`` left beside it (their
    ``.<name>.tmp-*`` and ``.<name>.old-*`` folders); call it only while no other writer of
    ``dest`` runs (under a lock).

    >>> import tempfile
    >>> dest = Path(tempfile.mkdtemp()) / "model"
    >>> (dest.parent / ".model.tmp-killed").mkdir()
    >>> remove_leftovers(dest)
    >>> list(dest.parent.iterdir())
    []
    """
    dest = Path(dest)
    for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.old-*"):
        for path in dest.parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)
