"""``key=value`` settings from the command line (``--option``), shared by every command."""

from __future__ import annotations

import json
from typing import Any

from heedful.errors import HeedfulError


def key_value(item: str, example: str = "--option n_steps=100") -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``, the value read as JSON when it parses (numbers,
    booleans, lists), else kept as text. A HeedfulError with ``example`` as hint otherwise."""
    if "=" not in item:
        raise HeedfulError(f"option {item!r} is not key=value", hint=f"e.g. {example}")
    key, value = item.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def options(raw: list[str] | None, example: str = "--option n_steps=100", **given: Any) -> dict[str, Any]:
    """The ``key=value`` items of ``raw`` as a dict, after the named settings in ``given`` that
    are not None (``raw`` wins on a clash)."""
    found = {k: v for k, v in given.items() if v is not None}
    found.update(key_value(item, example) for item in raw or [])
    return found
