"""Rotary position embeddings of config.json, by HF's definitions: the rotary base and, for scaled RoPE, the inverse
frequencies the model's `RotaryEmbedding` takes instead of megatron's plain ones (`models.build`).

A type is one function in `ROPE_TYPES` (HF's `rope_type`): the plain frequencies -> the scaled ones.
- `default`: plain RoPE;
- `linear`: every frequency divided by `factor`;
- `dynamic`: plain within `max_position_embeddings` (HF rescales only past it, and a run's sequences must fit it:
  `config.validate`);
- `llama3` (Llama 3.1-3.3): low frequencies divided by `factor`, high ones kept, a smooth blend between
  (`low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`).
Types that scale the attention too (`yarn`, `longrope`) are refused before the build, naming the field.

The engines read the same table: the native decoder takes the model's `RotaryEmbedding`, and SGLang reads
config.json itself.
"""
from __future__ import annotations

import math

import torch

from rlhf_mcore.registry import Registry

ROPE_TYPES: Registry = Registry("RoPE type (config.json rope_parameters.rope_type)")
ROPE_FIELDS = ("rope_parameters", "rope_scaling")  # transformers >= 5, and the older name


def rope_parameters(hf: dict) -> tuple[str, dict, str]:
    """(rope type, its parameters, the config.json field that holds them): the first field with a scaled type,
    else the first present; ("default", {}, "rope_parameters") when neither is.

    >>> rope_parameters({"rope_scaling": {"type": "linear", "factor": 2.0}})[:2]
    ('linear', {'type': 'linear', 'factor': 2.0})
    """
    found = [(f, hf.get(f)) for f in ROPE_FIELDS if hf.get(f)]
    for field, params in found:
        kind = params.get("rope_type", params.get("type")) or "default"
        if kind != "default":
            return kind, params, field
    return "default", (found[0][1] if found else {}), (found[0][0] if found else "rope_parameters")


# the parameters each type reads (HF's names)
REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings")}


def rope_errors(hf: dict, source: str) -> list[str]:
    """A line when config.json asks for a RoPE type that is not in `ROPE_TYPES`, or one per parameter it lacks.

    >>> rope_errors({"rope_scaling": {"rope_type": "linear"}}, "config.json")
    ["config.json: rope_scaling.factor is missing for rope type 'linear'. Add it (HF's RoPE parameters)."]
    """
    kind, params, field = rope_parameters(hf)
    if kind not in ROPE_TYPES:
        return [f"{source}: rope scaling type {kind!r} is not supported (field {field}). Supported: "
                f"{', '.join(ROPE_TYPES.names())}; use a model with one of them."]
    return [f"{source}: {field}.{key} is missing for rope type {kind!r}. Add it (HF's RoPE parameters)."
            for key in REQUIRED.get(kind, ()) if params.get(key) is None]


def rope_base(hf: dict) -> float:
    """The rotary base (`rope_theta`, in the RoPE parameters or at the top level as transformers < 5 wrote it)."""
    _, params, _ = rope_parameters(hf)
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def scaled_inv_freq(hf: dict, inv_freq: torch.Tensor) -> torch.Tensor:
    """The inverse frequencies of config.json's RoPE type, from the plain ones (megatron's, [dim / 2] fp32)."""
    kind, params, _ = rope_parameters(hf)
    return ROPE_TYPES.get(kind)(inv_freq, params)


@ROPE_TYPES.register("default")
def _default(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    return inv_freq


@ROPE_TYPES.register("linear")
def _linear(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    return inv_freq / float(params["factor"])


@ROPE_TYPES.register("dynamic")
def _dynamic(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    return inv_freq  # within max_position_embeddings (validated): HF's dynamic scaling starts past it


@ROPE_TYPES.register("llama3")
def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, blended, scaled)


def apply_to(rotary, hf: dict) -> None:
    """Give megatron's `RotaryEmbedding` config.json's frequencies (before its first forward: it caches tables)."""
    rotary.inv_freq = scaled_inv_freq(hf, rotary.inv_freq)


