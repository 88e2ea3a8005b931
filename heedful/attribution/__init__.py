"""Attribution methods. Importing this package registers every built-in method; :func:`methods`
lists them and :func:`get_method` finds one (see :mod:`heedful.registry`)."""

from __future__ import annotations

from heedful.attribution import (  # noqa: F401  (each module registers its methods)
    attention,
    attention_gradient,
    baseline,
    context,
    contributions,
    coperturbation,
    decomposition,
    gradient,
    individual_perturbation,
    perturbation,
    relevance,
    rise,
    surrogate,
    tdd,
    value_zeroing,
    vector,
)
from heedful.registry import FAMILIES, MethodInfo, find, registered


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
