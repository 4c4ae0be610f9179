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

An entry can declare what it needs when it registers (`traits`, a dataclass of the registry), so callers
ask the registry instead of keeping lists of names:

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Needs:
...     critic: bool = False
>>> EST = Registry("estimator", traits=Needs)
>>> _ = EST.register("gae", critic=True)(lambda inp: inp)
>>> _ = EST.register("grpo")(lambda inp: inp)
>>> EST.traits("gae").critic, EST.traits("grpo").critic
(True, False)
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def suggest(name: str, choices) -> str:
    """' Did you mean 'x'?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class Registry(Generic[T]):
    """Name -> entry. Registering a name twice raises; an unknown name lists the valid ones.

    `traits`: a dataclass whose fields each entry may set at registration (what the entry needs); entries
    registered with `hidden=True` are internal (not a value users may choose in the config)."""

    def __init__(self, kind: str, traits: type | None = None):
        self.kind = kind
        self._traits_type = traits
        self._entries: dict[str, T] = {}
        self._traits: dict[str, Any] = {}
        self._hidden: set[str] = set()

    def register(self, name: str, hidden: bool = False, **traits) -> Callable[[T], T]:
        if traits and self._traits_type is None:
            raise TypeError(f"{self.kind} '{name}': this registry declares no traits (got {sorted(traits)})")
        record = self._traits_type(**traits) if self._traits_type is not None else None

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = entry
            self._traits[name] = record
            if hidden:
                self._hidden.add(name)
            return entry

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.kind} '{name}'.{suggest(name, self._entries)} Available: {', '.join(self.names())}."
            )
        return self._entries[name]

    def traits(self, name: str):
        """What entry `name` declared at registration (an instance of the registry's traits dataclass)."""
        self.get(name)
        return self._traits[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def choices(self) -> list[str]:
        """The names a config may use, in registration order (hidden entries left out)."""
        return [n for n in self._entries if n not in self._hidden]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
