"""The three kinds of entry of the verl key table (`verl_keys.VERL_KEYS`): alias, ignored, rejected."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class VerlKey:
    ours: tuple[str, ...] = ()  # our keys this one sets (empty: ignored or rejected)
    convert: Callable[[Any], Any] | None = None  # verl value -> our value (None: as is)
    note: str = ""  # ignored: why it has no effect; rejected: what to use instead
    rejected: bool = False
    only: str | None = None  # ignored keys with one meaningful value: any other value is an error


def alias(*ours: str, convert=None, note: str = "") -> VerlKey:
    return VerlKey(ours=ours, convert=convert, note=note)


def ignored(why: str, only: str | None = None) -> VerlKey:
    return VerlKey(note=why, only=only)


def rejected(fix: str) -> VerlKey:
    return VerlKey(note=fix, rejected=True)
