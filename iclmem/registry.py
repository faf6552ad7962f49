"""One registry per extension point (models, manipulations, tasks), after lm-evaluation-harness."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from iclmem.errors import DuplicateNameError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object. Rejects duplicates; an unknown name is answered with the known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._items:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(item: T) -> T:
            return self.register(name, item)

        return wrap

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return sorted(self._items)
