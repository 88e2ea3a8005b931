"""Where heedful keeps what it builds: ``$HEEDFUL_HOME`` or the per-user cache directory."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from heedful.errors import HeedfulError


def heedful_home() -> Path:
    """The cache root: ``$HEEDFUL_HOME``, else ``$XDG_CACHE_HOME/heedful``, else ``~/.cache/heedful``."""
    if env := os.environ.get("HEEDFUL_HOME"):
        root = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "heedful"
    root.mkdir(parents=True, exist_ok=True)
    (root / "downloads").mkdir(exist_ok=True)
    return root


def pip_download(command: Callable[[Path], list[str]], pick: Callable[[Path], Path | None], what: str) -> Path:
    """A file fetched with ``pip download`` into ``heedful_home()/downloads``: ``command(folder)``
    is the pip command that downloads into ``folder`` (a temporary one, so an interrupted
    download leaves nothing behind), ``pick(folder)`` finds the file in it, which is then moved
    into place. A :class:`HeedfulError` with pip's last lines when that fails; ``what`` names
    the file in it."""
    downloads = heedful_home() / "downloads"
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        result = subprocess.run(command(Path(tmp)), capture_output=True, text=True)
        found = pick(Path(tmp))
        if result.returncode != 0 or found is None:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise HeedfulError(
                f"could not download {what} with pip" + (f":\n{tail}" if tail else ""),
                hint=f"check that PyPI is reachable, or run by hand: {' '.join(command(downloads))}",
            )
        target = downloads / found.name
        os.replace(found, target)
    return target
