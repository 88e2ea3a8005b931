"""Method options, read from the method's own signature: names, types, defaults, choices, ranges.

A method declares each option once, as a keyword parameter with a type hint and a default::

    def integrated_gradients(
        problem: Problem,
        *,
        n_steps: Annotated[int, AT_LEAST_ONE] = 50,
        baseline: Literal["pad", "mask", "zero"] = "pad",
        internal_batch_size: Annotated[int | None, RUNTIME] = None,
    ) -> torch.Tensor: ...

:func:`option_specs` turns that into :class:`OptionSpec` s; :meth:`OptionSpec.check` validates
and coerces one value. ``Literal[...]`` gives the choices, ``Annotated[..., Range(...)]`` the
allowed interval, ``Annotated[..., RUNTIME]`` marks an option that changes how the work is split
(chunk sizes) but not the result, so it stays out of results-store keys. ``Annotated[...,
KEYED_WHEN_SET]`` marks an option added to a method after results were stored: it enters the
key only when it differs from its default, so the keys of runs at the defaults stay what they were.
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from heedful.errors import Hint, InputError, did_you_mean

_NONE = type(None)


@dataclass(frozen=True)
class Range:
    """The interval a numeric option must lie in; ``None`` leaves that side open-ended."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


@dataclass(frozen=True)
class Runtime:
    """Marks an option that decides how work is chunked, not what is computed."""


@dataclass(frozen=True)
class KeyedWhenSet:
    """Marks an option that enters results-store keys only when it is not at its default."""


AT_LEAST_ONE = Range(1)
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)
UNIT = Range(0, 1)
RUNTIME = Runtime()
KEYED_WHEN_SET = KeyedWhenSet()


@dataclass(frozen=True)
class OptionSpec:
    """One option of a method. ``kinds``: the accepted value types (``None`` in it when the
    option may be ``None``; empty: any value); ``choices``: the allowed values of a ``Literal``;
    ``range``: allowed interval of a number; ``runtime``: excluded from results-store keys;
    ``extras``: further ``Annotated`` metadata, read by the modules that define it (e.g.
    :class:`heedful.engine.precision.Tolerates`)."""

    name: str
    default: Any
    kinds: tuple[type, ...]
    choices: tuple[Any, ...] | None = None
    range: Range | None = None
    runtime: bool = False
    keyed_when_set: bool = False
    extras: tuple[Any, ...] = ()

    def extra(self, kind: type) -> Any:
        """The first of :attr:`extras` of type ``kind``, or ``None``."""
        return next((e for e in self.extras if isinstance(e, kind)), None)

    def describe(self) -> str:
        """What the option accepts, for messages and tables (``int >= 1``, ``'pad' | 'mask'``)."""
        if self.choices is not None:
            parts = [repr(c) for c in self.choices]
        else:
            parts = [
                ("None" if k is _NONE else k.__name__) + (f" {self.range.describe()}" if self.range and k is not _NONE else "")
                for k in self.kinds
            ] or ["any value"]
        return " | ".join(parts)

    def check(self, method: str, value: Any) -> Any:
        """``value`` validated and coerced (an int for a float option becomes a float); an
        :class:`InputError` naming the option and what it accepts otherwise."""
        if self.choices is not None:
            for allowed in self.choices:
                if type(value) is type(allowed) and value == allowed:
                    return allowed
            raise self._error(method, value)
        if not self.kinds:
            return value
        if value is None:
            if _NONE in self.kinds:
                return None
            raise self._error(method, value)
        coerced = _coerce(value, self.kinds)
        if coerced is _INVALID:
            raise self._error(method, value)
        if self.range is not None and isinstance(coerced, int | float) and not isinstance(coerced, bool):
            if math.isnan(coerced) or not self.range.contains(coerced):
                raise self._error(method, value)
        return coerced

    def _error(self, method: str, value: Any) -> InputError:
        shown = value if len(repr(value)) < 60 else f"{repr(value)[:57]}..."
        return InputError(
            f"{method}: {self.name}={shown!r} is not {self.describe()}",
            hint=f"{self.name} takes {self.describe()} (default {self.default!r})",
        )


_INVALID = object()


def _coerce(value: Any, kinds: tuple[type, ...]) -> Any:
    """``value`` as one of ``kinds`` (bool never counts as a number; ints widen to float)."""
    if isinstance(value, bool):
        return value if bool in kinds else _INVALID
    if hasattr(value, "item") and not isinstance(value, str | bytes) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy / torch scalars
    for kind in kinds:
        if kind is _NONE or kind is bool:
            continue
        if kind is float and isinstance(value, int | float):
            return float(value)
        if kind is int and isinstance(value, int):
            return int(value)
        if isinstance(value, kind):
            return value
    return _INVALID


def _spec(name: str, hint: Any, default: Any) -> OptionSpec:
    range_, runtime, when_set, others = None, False, False, []
    if typing.get_origin(hint) is typing.Annotated:
        hint, *extras = typing.get_args(hint)
        for extra in extras:
            if isinstance(extra, Range):
                range_ = extra
            elif isinstance(extra, Runtime):
                runtime = True
            elif isinstance(extra, KeyedWhenSet):
                when_set = True
            else:
                others.append(extra)
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds: list[type] = []
    choices: list[Any] | None = None
    for member in members:
        if typing.get_origin(member) is typing.Literal:
            choices = (choices or []) + list(typing.get_args(member))
        elif member is Any:
            return OptionSpec(name, default, (), None, range_, runtime, when_set, tuple(others))
        elif member is None or member is _NONE:
            kinds.append(_NONE)
        elif isinstance(member, type):
            kinds.append(member)
        else:
            origin = typing.get_origin(member)
            kinds.append(origin if isinstance(origin, type) else object)
    if choices is not None:
        if _NONE in kinds:
            choices.append(None)
        kinds = []
    return OptionSpec(name, default, tuple(kinds), None if choices is None else tuple(choices), range_, runtime, when_set, tuple(others))


def option_specs(fn: Callable, positional: int = 1) -> tuple[OptionSpec, ...]:
    """The options of ``fn``: every parameter after the first ``positional`` ones, each with a
    type hint and a default (a method without one fails at registration, not at run time)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())[positional:]
    found = []
    for param in params:
        if param.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(f"{fn.__name__}: methods list their options; **{param.name} is not allowed")
        if param.default is inspect.Parameter.empty:
            raise TypeError(f"{fn.__name__}: option {param.name!r} has no default")
        if param.name not in hints:
            raise TypeError(f"{fn.__name__}: option {param.name!r} has no type hint")
        found.append(_spec(param.name, hints[param.name], param.default))
    return tuple(found)


def bind_options(method: str, specs: tuple[OptionSpec, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``specs``: the ``given`` ones validated, the rest at their defaults, in
    signature order. Unknown names fail first, naming the options the method takes."""
    known = {s.name: s for s in specs}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InputError(
            f"{method} does not take the option(s) {', '.join(unknown)}",
            hint=did_you_mean(
                unknown[0], known, "option",
                listing=Hint(f"{method}'s options: {', '.join(known) or 'none'} (see heedful.get_method({method!r}).options)",
                             f"{method}'s options: {', '.join(known) or 'none'} (see `heedful methods {method}`)"),
            ),
        )
    return {name: (spec.check(method, given[name]) if name in given else spec.default) for name, spec in known.items()}


def jsonable(value: Any) -> Any:
    """``value`` in a JSON-ready form: arrays and tensors as lists, objects with ``to_dict`` as
    that dict, tuples as lists; anything else JSON does not know as its ``repr``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if hasattr(value, "__fspath__"):
        return str(value)
    return repr(value)


def canonical_json(value: Any) -> str:
    """One stable text for ``value`` (sorted keys, JSON-ready form): the form options are keyed by."""
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"))
