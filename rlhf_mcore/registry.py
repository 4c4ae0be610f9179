"""One small registry type for every pluggable piece (advantages, losses, rewards, model families).

>>> LOSSES = Registry("policy loss")
>>> @LOSSES.register("vanilla")
... def vanilla(x):
...     return x
>>> LOSSES.get("vanilla")(3)
3
>>> LOSSES.get("vanila")
Traceback (most recent call last):
...
ValueError: unknown policy loss 'vanila'. Did you mean 'vanilla'? Available: vanilla.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def suggest(name: str, choices) -> str:
    """' Did you mean 'x'?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class Registry(Generic[T]):
    """Name -> entry. Registering a name twice raises; an unknown name lists the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.kind} '{name}'.{suggest(name, self._entries)} Available: {', '.join(self.names())}."
            )
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
