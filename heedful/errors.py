"""User-facing errors: each names the problem and the fix.

A fix is said the way the user will apply it: a :class:`Hint` holds it once for Python
(``device='cpu'``) and once for the command line (``--device cpu``). ``str(error)`` and
``error.hint`` speak Python -- the library raised it in Python code -- and the command line
prints ``error.cli_hint``. A plain string hint reads the same in both.

>>> error = InputError("device 'cuda' is not available here", hint=Hint("pass device='cpu'", "use --device cpu"))
>>> error.hint, error.cli_hint
("pass device='cpu'", 'use --device cpu')
>>> InputError("unknown method 'integrated_gradient'", hint=did_you_mean("integrated_gradient", ["saliency", "integrated_gradients"], "method")).hint
"did you mean 'integrated_gradients'?"
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hint:
    """One fix said twice: as Python code (``python``) and as command-line flags (``cli``)."""

    python: str
    cli: str


class HeedfulError(Exception):
    """An error caused by the user's input or set-up, shown without a traceback.

    ``hint`` says what to do about it (in Python's terms; ``cli_hint``: in the command line's).
    """

    def __init__(self, message: str, hint: str | Hint | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = hint

    @property
    def hint(self) -> str | None:
        return self.fix.python if isinstance(self.fix, Hint) else self.fix

    @property
    def cli_hint(self) -> str | None:
        return self.fix.cli if isinstance(self.fix, Hint) else self.fix

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


def close_matches(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The names of ``known`` closest to ``name`` (case ignored; difflib's ratio of at least
    0.6), best first; then those ``name`` abbreviates -- their initials (``ig``:
    ``integrated_gradients``) or one of their words (``shap``: ``kernel_shap``), two letters
    at least."""
    known = list(known)
    folded = {k.lower(): k for k in known}
    found = [folded[m] for m in difflib.get_close_matches(str(name).lower(), list(folded), n=n, cutoff=0.6)]
    short = str(name).lower().replace("-", "_").strip()
    if len(short) >= 2:
        words = {k: [w for w in k.lower().replace("-", "_").split("_") if w] for k in known}
        found += [k for k in known if "".join(w[0] for w in words[k]) == short or (len(words[k]) > 1 and short in words[k])]
    return list(dict.fromkeys(found))[:n]


def did_you_mean(name: str, known: Iterable[str], what: str, listing: str | Hint | None = None) -> str | Hint:
    """A hint for an unknown ``name`` among ``known`` (``what`` they are: method, option,
    model, label): ``did you mean 'x'?`` (or ``'x' or 'y'``) when some are close, else
    ``listing`` (default: the known ``what``\\ s, all of them when there are few)."""
    known = list(known)
    close = close_matches(name, known)
    if close:
        return f"did you mean {' or '.join(repr(c) for c in close)}?"
    if listing is not None:
        return listing
    shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
    return f"the {what}s: {shown}"
