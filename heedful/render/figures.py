"""matplotlib set up once for heedful's figures: the Agg backend (PNG files, no display), so
plots render on a headless machine and in worker threads."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: matplotlib is optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
