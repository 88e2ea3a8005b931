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


class UnsupportedModelError(HeedfulError):
    """The architecture or its head is not one heedful knows how to explain."""


class InputError(HeedfulError):
    """Bad text, target, label or option."""


class MethodError(HeedfulError):
    """Unknown method, or a method that does not support the model's task."""


def close_matches(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The names of ``known`` closest to ``name`` (case ignored; difflib's ratio of at least
    0.6), best first."""
    known = list(known)
    folded = {k.lower(): k for k in known}
    return [folded[m] for m in difflib.get_close_matches(str(name).lower(), list(folded), n=n, cutoff=0.6)]


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
