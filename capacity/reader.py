"""Typed reads from a parsed YAML mapping, each error naming the dotted key it is about.

`Section` wraps one mapping at a path (`gpu`, `throughput.points[1]`); it tracks which keys were read
so `finish()` can reject unknown ones (typos) by name. Booleans are not numbers here, although
Python says `True == 1`; numeric strings are, because PyYAML reads `13e9` as a string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from capacity.errors import InputError

_MISSING: Any = object()


class Section:
    """One mapping of the input file; every read validates and names `path.key` on failure."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise InputError(path or "config", f"must be a mapping, got {_type_name(data)}")
        for key in data:
            if not isinstance(key, str):
                raise InputError(path or "config", f"keys must be strings, got {key!r}")
        self.data: Mapping[str, Any] = data
        self.path = path
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        """The dotted path of `name` inside this section."""
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, default: Any) -> Any:
        self._read.add(name)
        if name in self.data and self.data[name] is not None:
            return self.data[name]
        if default is _MISSING:
            raise InputError(self.key(name), "is required")
        return default

    def section(self, name: str, *, required: bool = True) -> Section:
        """The nested mapping `name`; an empty one when optional and absent."""
        return Section(self._get(name, _MISSING if required else {}), self.key(name))

    def sections(self, name: str) -> list[Section]:
        """A non-empty list of mappings, each at `name[i]`."""
        value = self._get(name, _MISSING)
        if not isinstance(value, list) or not value:
            raise InputError(self.key(name), f"must be a non-empty list, got {_type_name(value)}")
        return [Section(item, f"{self.key(name)}[{index}]") for index, item in enumerate(value)]

    def string(self, name: str, *, default: Any = _MISSING) -> str:
        """A string value (numbers are accepted and converted: a model may be called `13`)."""
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise InputError(self.key(name), f"must be a string, got {_type_name(value)}")
        return str(value)

    def number(
        self,
        name: str,
        *,
        default: Any = _MISSING,
        positive: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        """A finite number; `positive` means > 0, `minimum`/`maximum` are inclusive bounds."""
        value = _as_number(self._get(name, default))
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InputError(self.key(name), f"must be a number, got {_type_name(value)} {value!r}")
        if positive and value <= 0:
            raise InputError(self.key(name), f"must be > 0, got {value!r}")
        if minimum is not None and value < minimum:
            raise InputError(self.key(name), f"must be >= {minimum:g}, got {value!r}")
        if maximum is not None and value > maximum:
            raise InputError(self.key(name), f"must be <= {maximum:g}, got {value!r}")
        return float(value)

    def optional_number(self, name: str, **bounds: Any) -> float | None:
        """A number, or None when absent (or null)."""
        if self.data.get(name) is None:
            self._read.add(name)
            return None
        return self.number(name, **bounds)

    def integer(self, name: str, *, default: Any = _MISSING, minimum: int | None = None) -> int:
        """A whole number (2.0 is accepted, 2.5 is not)."""
        value = self.number(name, default=default, minimum=minimum)
        if not value.is_integer():
            raise InputError(self.key(name), f"must be a whole number, got {value!r}")
        return int(value)

    def optional_integer(self, name: str, *, minimum: int | None = None) -> int | None:
        """A whole number, or None when absent (or null)."""
        if self.data.get(name) is None:
            self._read.add(name)
            return None
        return self.integer(name, minimum=minimum)

    def integers(self, name: str, *, default: tuple[int, ...], minimum: int = 1) -> tuple[int, ...]:
        """A non-empty list of whole numbers ≥ `minimum` (`default` when absent)."""
        value = self._get(name, default)
        if not isinstance(value, list | tuple) or not value:
            raise InputError(self.key(name), f"must be a non-empty list of integers, got {_type_name(value)}")
        holder = Section({str(i): item for i, item in enumerate(value)}, self.key(name))
        return tuple(holder.integer(str(i), minimum=minimum) for i in range(len(value)))

    def finish(self) -> None:
        """Reject keys nobody read: they are typos or unsupported options."""
        unknown = sorted(set(self.data) - self._read)
        if unknown:
            expected = ", ".join(sorted(self._read))
            raise InputError(self.key(unknown[0]), f"unknown key (expected one of: {expected})")


def _as_number(value: object) -> object:
    """Numeric strings become floats: PyYAML (YAML 1.1) reads `13e9` as the string '13e9'."""
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return value
    return value


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__
