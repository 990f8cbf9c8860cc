"""Typed, validated reads of a pool's policy options and of each plugin entry of a profile.

Every error is a `ValueError` that names the offending option, so configuration fails at start with a
message an operator can act on. Unknown option names are rejected too: a typo must not silently fall
back to a default.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any, TypeVar

_EnumT = TypeVar("_EnumT", bound=StrEnum)


class OptionReader:
    """Reads options for one policy; `where` (e.g. the policy name) prefixes every error message."""

    def __init__(self, options: Mapping[str, Any], where: str) -> None:
        self._options = options
        self._where = where

    @property
    def where(self) -> str:
        """The prefix of every error message (e.g. `policy prefix-index`, `profile.picker (ring)`)."""
        return self._where

    def number(self, name: str, default: float, minimum: float | None = None) -> float:
        """A real number (ints accepted, bools rejected), at least `minimum` when given."""
        value = self._options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{self._where}: option {name!r} must be a number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{self._where}: option {name!r} must be >= {minimum}, got {value!r}")
        return float(value)

    def integer(self, name: str, default: int, minimum: int | None = None) -> int:
        """An integer (bools rejected), at least `minimum` when given."""
        value = self._options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self._where}: option {name!r} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{self._where}: option {name!r} must be >= {minimum}, got {value!r}")
        return value

    def names(self) -> frozenset[str]:
        """The option names given (null values included)."""
        return frozenset(self._options)

    def raw(self, name: str) -> Any:
        """The option's value as given (validated where it is built)."""
        return self._options.get(name)

    def optional_number(self, name: str, minimum: float | None = None) -> float | None:
        """`number`, or None when the option is absent or null."""
        if self._options.get(name) is None:
            return None
        return self.number(name, 0.0, minimum)

    def optional_integer(self, name: str, minimum: int | None = None) -> int | None:
        """`integer`, or None when the option is absent or null."""
        if self._options.get(name) is None:
            return None
        return self.integer(name, 0, minimum)

    def choice(self, name: str, enum: type[_EnumT], default: _EnumT) -> _EnumT:
        """One of the values of the `StrEnum` `enum`."""
        value = self._options.get(name, default)
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(member.value for member in enum)
            raise ValueError(
                f"{self._where}: option {name!r} must be one of {allowed}, got {value!r}"
            ) from None

    def reject_unknown(self, known: Collection[str]) -> None:
        """Raise when an option name is not in `known` (catches typos at start)."""
        unknown = sorted(set(self._options) - set(known))
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            raise ValueError(f"{self._where}: unknown option(s) {', '.join(unknown)}; known: {allowed}")
