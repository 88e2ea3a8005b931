"""Attribution methods. Importing this package registers every built-in method (each module of
the package, found on import: :data:`BUILT_IN`); :func:`methods` lists them and
:func:`get_method` finds one (see :mod:`heedful.registry`)."""

from __future__ import annotations

import importlib
import pkgutil

from heedful.registry import FAMILIES, MethodInfo, find, registered

BUILT_IN: tuple[str, ...] = tuple(
    sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
)
"""The modules of this package that define methods: every module not named with a leading
underscore (those hold shared helpers). Each registers its methods when imported, here, so a new
built-in method needs only its module."""

for _module in BUILT_IN:
    importlib.import_module(f"{__name__}.{_module}")


def methods(family: str | None = None, task: str | None = None) -> list[MethodInfo]:
    """Every registered method, by family then name, optionally only one ``family`` or the
    methods that support ``task``.

    >>> import heedful
    >>> "normxlogit" in [m.name for m in heedful.methods()]
    True
    """
    order = {f: i for i, f in enumerate(FAMILIES)}
    found = sorted(registered().values(), key=lambda m: (order.get(m.family, len(order)), m.name))
    return [m for m in found if (family is None or m.family == family) and (task is None or task in m.tasks)]


def get_method(name: str, task: str | None = None) -> MethodInfo:
    """The method called ``name`` (a :class:`~heedful.MethodError` naming the available ones
    otherwise); with ``task``, one that supports it.

    >>> import heedful
    >>> heedful.get_method("integrated_gradients").defaults["n_steps"]
    50
    """
    return find(name, task)


def span_methods() -> list[str]:
    """Names of the methods that explain a span target (several tokens' summed output).

    >>> "integrated_gradients" in span_methods()
    True
    """
    return [m.name for m in methods() if m.spans]
