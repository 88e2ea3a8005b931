"""Where heedful keeps what it builds: ``$HEEDFUL_HOME`` or the per-user cache directory."""

from __future__ import annotations

import os
from pathlib import Path


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
