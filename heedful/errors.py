"""User-facing errors: each names the problem and the fix."""

from __future__ import annotations


class HeedfulError(Exception):
    """An error caused by the user's input or set-up, shown without a traceback.

    ``hint`` says what to do about it.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


EXTRAS: dict[str, str] = {
    "bench": "SciPy and Inseq for the benchmarks' statistics and comparisons",
    "parquet": "pyarrow for Parquet tables",
    "serve": "FastAPI and uvicorn for heedful serve",
    "ray": "Ray for heedful bench --engine ray",
}
"""The optional extras of ``pyproject.toml`` a message may ask for, and what each brings."""


def install_hint(extra: str) -> str:
    """``pip install 'heedful[extra]'``: the command that installs an extra (:data:`EXTRAS`).
    Help texts read as rich markup must escape it (``rich.markup.escape``) or the markup eats
    the bracket."""
    if extra not in EXTRAS:
        raise KeyError(f"no extra {extra!r} (one of {', '.join(EXTRAS)})")
    return f"pip install 'heedful[{extra}]'"


class UnsupportedModelError(HeedfulError):
    """The architecture or its head is not one heedful knows how to explain."""


class InputError(HeedfulError):
    """Bad text, target, label or option."""


class MethodError(HeedfulError):
    """Unknown method, or a method that does not support the model's task."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during work that keeps what it computed (``heedful bench``): ``message`` says what
    was kept and how to resume. A ``KeyboardInterrupt``, so code that stops on Ctrl-C still does;
    the command prints the message and exits 130."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
