"""One process's share of a list of work units: ``k`` processes side by side on one store, each
measuring every ``k``-th unit from its ``i``-th (``share=i/k``)."""

from __future__ import annotations

from dataclasses import dataclass

from heedful.errors import InputError


@dataclass(frozen=True)
class Share:
    """Units ``mine``, ``mine + of``, ``mine + 2 of``, ... of a list (``0 <= mine < of``).

    >>> share = Share.parse("1/2")
    >>> [i for i in range(5) if share.takes(i)]
    [1, 3]
    >>> str(share)
    '1/2'
    """

    mine: int = 0
    of: int = 1

    @classmethod
    def parse(cls, text: str | None, option: str = "share") -> Share:
        """``"i/k"`` (``None`` or ``""``: every unit, ``0/1``); ``option`` names the setting as
        the user spells it (``"--share"``, ``"share="``) in the one-line
        :class:`~heedful.errors.InputError` a bad value raises."""
        if text in (None, ""):
            return cls()
        spell = option if option.endswith("=") else f"{option} "
        example = f"e.g. {spell}0/2 and {spell}1/2 for two processes"
        try:
            mine, of = (int(part) for part in str(text).split("/"))
        except ValueError as exc:
            raise InputError(f"{spell}{text!r} is not i/k", hint=example) from exc
        if not 0 <= mine < of:
            raise InputError(f"{spell}{text!r}: i must be in 0..k-1", hint=example)
        return cls(mine, of)

    def takes(self, index: int) -> bool:
        """Whether unit ``index`` (0-based) is this process's."""
        return index % self.of == self.mine

    def __str__(self) -> str:
        return f"{self.mine}/{self.of}"


EVERY = Share()
"""The share of a process alone on its store: every unit (``0/1``)."""
