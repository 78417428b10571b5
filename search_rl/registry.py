"""``Registry[T]``: the one mechanism behind every extension point (rewards, advantage estimators, losses).

Entries are registered by name with a decorator; ``get`` also resolves ``"pkg.module:attr"`` import strings, so
user code reaches Ray workers as a string instead of a pickled function object.

>>> SQUARES: Registry[object] = Registry("squares")
>>> @SQUARES.register("two")
... def two() -> int:
...     return 4
>>> SQUARES.get("two")()
4
>>> SQUARES.names()
['two']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of entries of one kind.

    Args:
        kind: What the entries are, used in error messages (e.g. ``"reward function"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator adding an entry under ``name``.

        Raises:
            ValueError: if ``name`` is already registered (two entries must never silently shadow each other).
        """

        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._entries[name]!r}); pick another name"
                )
            self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        """The entry registered as ``name``, or the attribute named by an import string ``"pkg.module:attr"``.

        Raises:
            KeyError: for an unknown name; the message lists the registered names.
            ImportError: when an import string's module cannot be imported.
            AttributeError: when an import string's module has no such attribute.
        """
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            module_name, _, attr = name.partition(":")
            module = importlib.import_module(module_name)
            try:
                return getattr(module, attr)  # type: ignore[no-any-return]
            except AttributeError as e:
                raise AttributeError(
                    f"{self.kind} import string {name!r}: module {module_name!r} has no {attr!r}"
                ) from e
        raise KeyError(
            f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or '(none)'}; "
            "or pass an import string 'package.module:attribute'"
        )

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
