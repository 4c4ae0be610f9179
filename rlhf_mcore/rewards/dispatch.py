"""Reward functions by data source, and the one check of what they return.

Every entry has verl's signature ``fn(data_source, solution_str, ground_truth, extra_info) -> float | dict``;
a dict must hold ``"score"`` and may hold more keys (``"acc"``, ``"pred"``) that become per-sample metrics.
One function may serve several data sources (``"openai/gsm8k"`` and ``"gsm8k"`` name the same reward).

>>> import rlhf_mcore.rewards  # registers the built-in rewards
>>> get_reward_fn("openai/gsm8k") is get_reward_fn("gsm8k")
True
>>> get_reward_fn("gsm8k")("gsm8k", "so #### 72", "72", None)["score"]
1.0
>>> split_output({"score": 1, "acc": 1.0})
(1.0, {'acc': 1.0})
"""
from __future__ import annotations

import math
from typing import Any, Callable

from rlhf_mcore.registry import Registry

RewardFn = Callable[[str, str, Any, "dict | None"], "float | dict"]

REWARDS: Registry[RewardFn] = Registry("reward data_source")


def register_reward(*data_sources: str) -> Callable[[RewardFn], RewardFn]:
    """Register one reward function under every given data_source name (duplicates raise)."""
    if not data_sources:
        raise ValueError("register_reward needs at least one data_source name")

    def add(fn: RewardFn) -> RewardFn:
        for name in data_sources:
            REWARDS.register(name)(fn)
        return fn

    return add


PREFIXES: dict[str, RewardFn] = {}  # verl routes whole families by prefix (every "aime*" to math_dapo)


def register_reward_prefix(prefix: str) -> Callable[[RewardFn], RewardFn]:
    """Register one reward function for every data_source that starts with `prefix` (exact names win)."""
    def add(fn: RewardFn) -> RewardFn:
        if prefix in PREFIXES:
            raise ValueError(f"reward prefix {prefix!r} is registered twice")
        PREFIXES[prefix] = fn
        return fn

    return add


def has_reward(data_source: str) -> bool:
    return data_source in REWARDS or any(data_source.startswith(p) for p in PREFIXES)


def known_sources() -> list[str]:
    """The registered names and prefixes (shown as `prefix*`), for error messages."""
    return REWARDS.names() + [f"{p}*" for p in sorted(PREFIXES)]


def get_reward_fn(data_source: str) -> RewardFn:
    """The reward registered for ``data_source`` (an exact name, else a prefix); unknown names raise ValueError
    with the valid ones."""
    if data_source not in REWARDS:
        for prefix, fn in PREFIXES.items():
            if data_source.startswith(prefix):
                return fn
    return REWARDS.get(data_source)


def split_output(out: Any) -> tuple[float, dict[str, Any]]:
    """Turn a reward's return value into ``(score, extra)``; raise TypeError/ValueError when it is malformed.

    Accepts a real number (bools count as 0/1) or a dict with a numeric ``"score"``; the score must be finite.
    """
    if isinstance(out, dict):
        if "score" not in out:
            raise ValueError(f"reward dict must contain 'score' (got keys {sorted(out)})")
        extra = {k: v for k, v in out.items() if k != "score"}
        score = out["score"]
    else:
        extra, score = {}, out
    if not isinstance(score, (int, float)) and not _is_numpy_scalar(score):
        raise TypeError(f"reward score must be a number (got {type(score).__name__}: {score!r})")
    score = float(score)
    if not math.isfinite(score):
        raise ValueError(f"reward score must be finite (got {score})")
    return score, extra


def call_reward(fn: RewardFn, data_source: str, solution: str, ground_truth: Any, extra_info: Any) -> tuple:
    """One reward call as an outcome: ``("ok", score, extra)`` or ``("error", message)``; never raises."""
    try:
        score, extra = split_output(fn(data_source, solution, ground_truth, extra_info))
    except Exception as err:
        return ("error", f"{type(err).__name__}: {err}")
    return ("ok", score, extra)


def _is_numpy_scalar(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0
