"""Field checks shared by the config sections: each returns a list of errors (empty when the value is fine), one
line per bad field naming the dotted key, the value and the fix."""
from __future__ import annotations

import dataclasses
import math

DC = dict(kw_only=True, slots=True)  # every config section: keyword-only, slotted dataclasses
# model.target_modules' names: HF projection names (rlhf_mcore.models.lora maps them onto megatron's layers)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# ... or megatron's linear names (Megatron-Bridge's: verl's megatron LoRA, slime), each standing for its projections
LORA_MEGATRON_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def choice(key: str, value, options) -> list[str]:
    """One error when `value` is not among `options`."""
    if value in options:
        return []
    return [f"{key}: must be one of {', '.join(map(str, options))} (got {value!r}). Pick one of those."]


def positive(key: str, value, allow_zero: bool = False) -> list[str]:
    if value > 0 or (allow_zero and value == 0):
        return []
    bound = ">= 0" if allow_zero else "> 0"
    return [f"{key}: must be {bound} (got {value!r}). Set a {'non-negative' if allow_zero else 'positive'} value."]


def in_range(key: str, value, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False,
             fix: str = "") -> list[str]:
    """One error when `value` lies outside [lo, hi] (a parenthesis marks an open end)."""
    above = value > lo if lo_open else value >= lo
    below = value < hi if hi_open else value <= hi
    if above and below:
        return []
    interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    return [f"{key}: must be in {interval} (got {value!r}). {fix or 'Set a value in that range.'}"]


def non_finite_floats(section, prefix: str) -> list[str]:
    """An error for every float field that is inf or nan (no key accepts them: lr=inf trains on garbage)."""
    errs = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            errs += non_finite_floats(value, f"{prefix}.{f.name}")
        elif isinstance(value, float) and not math.isfinite(value):
            errs.append(f"{prefix}.{f.name}: must be a finite number (got {value!r}). Write a finite value.")
    return errs
