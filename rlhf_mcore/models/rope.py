"""Rotary position embeddings of config.json, by HF's definitions: the rotary base, for scaled RoPE the inverse
frequencies the model's `RotaryEmbedding` takes instead of megatron's plain ones (`models.build`), and for YaRN the
attention factor that multiplies cos and sin.

A type is one function in `ROPE_TYPES` (HF's `rope_type`): the plain frequencies -> the scaled ones.
- `default`: plain RoPE;
- `linear`: every frequency divided by `factor`;
- `dynamic`: plain within `max_position_embeddings` (HF rescales only past it, and a run's sequences must fit it:
  `config.validate`);
- `llama3` (Llama 3.1-3.3): low frequencies divided by `factor`, high ones kept, a smooth blend between
  (`low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`);
- `yarn` (Qwen2.5 / Qwen3 long context, gpt-oss): frequencies that turn fewer than `beta_slow` (default 1) times
  over the original context are divided by `factor`, those that turn more than `beta_fast` (default 32) times are
  kept, a linear ramp over the dimensions between (`truncate`, default true, rounds its ends outwards). cos and
  sin are multiplied by the attention factor 0.1 ln(factor) + 1, or by `mscale` / `mscale_all_dim`'s ratio when
  both are set. `original_max_position_embeddings` falls back to `max_position_embeddings`, as in HF.
`longrope` (two frequency sets switched by the sequence length) is refused before the build, naming the field.

The attention factor reaches every place RoPE is applied through megatron's own YaRN hook: `megatron_fields` puts
config.json's factor and mscales on the TransformerConfig, whose attention passes the factor they give (megatron's
formula is HF's) to `apply_rotary_pos_emb` as `mscale`; the padded, packed and Transformer Engine paths all go
through it, and the native decoder reads it with `attention_scaling`. An explicit `attention_factor` that differs
from what the factor gives is refused (megatron's hook cannot carry it). SGLang reads config.json itself.
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


def standard_parameters(hf: dict) -> tuple[str, dict]:
    """(rope type, its parameters completed as transformers' `standardize_rope_params` does): `rope_theta` from the
    top level when the parameters lack it; `original_max_position_embeddings` from the top level first (Phi-3's
    place), else the parameters', else `max_position_embeddings`.

    >>> standard_parameters({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4}})[1]
    {'rope_type': 'yarn', 'factor': 4, 'rope_theta': 10000.0, 'original_max_position_embeddings': 64}
    """
    kind, params, _ = rope_parameters(hf)
    params = {**params, "rope_theta": rope_base(hf)}
    if kind in ("llama3", "yarn"):
        old = hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = old or hf.get("max_position_embeddings")
    return kind, params


# the parameters each type reads that have no default (HF's names)
REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"), "yarn": ("factor",)}


def rope_errors(hf: dict, source: str) -> list[str]:
    """A line when config.json asks for a RoPE type that is not in `ROPE_TYPES`, one per parameter it lacks, and
    one for a YaRN `attention_factor` other than the one its factor gives.

    >>> rope_errors({"rope_scaling": {"rope_type": "linear"}}, "config.json")
    ["config.json: rope_scaling.factor is missing for rope type 'linear'. Add it (HF's RoPE parameters)."]
    """
    kind, params, field = rope_parameters(hf)
    if kind not in ROPE_TYPES:
        return [f"{source}: rope scaling type {kind!r} is not supported (field {field}). Supported: "
                f"{', '.join(ROPE_TYPES.names())}; use a model with one of them."]
    errs = [f"{source}: {field}.{key} is missing for rope type {kind!r}. Add it (HF's RoPE parameters)."
            for key in REQUIRED.get(kind, ()) if params.get(key) is None]
    given = params.get("attention_factor")
    own = yarn_attention_factor({**params, "attention_factor": None}) if kind == "yarn" and not errs else given
    if given is not None and float(given) != own:
        errs.append(f"{source}: {field}.attention_factor={given} is not supported: only the one factor/mscale give "
                    f"({own:.6g}) is (megatron's YaRN hook). Use a model without it.")
    return errs


def rope_base(hf: dict) -> float:
    """The rotary base (`rope_theta`, in the RoPE parameters or at the top level as transformers < 5 wrote it)."""
    _, params, _ = rope_parameters(hf)
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def scaled_inv_freq(hf: dict, inv_freq: torch.Tensor) -> torch.Tensor:
    """The inverse frequencies of config.json's RoPE type, from the plain ones (megatron's, [dim / 2] fp32)."""
    kind, params = standard_parameters(hf)
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


def yarn_dim(rotations: float, dim: int, base: float, old_context: float) -> float:
    """The (fractional) rotary dimension whose frequency turns `rotations` times over `old_context` positions.

    >>> round(yarn_dim(1, 128, 10000.0, 4096), 3), round(yarn_dim(32, 128, 10000.0, 4096), 3)
    (45.027, 20.944)
    """
    return dim * math.log(old_context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_ramp(low: float, high: float, num: int) -> torch.Tensor:
    """[num] fp32: 0 up to index `low`, 1 from `high`, linear between (interpolation's share at each frequency).

    >>> yarn_ramp(1, 3, 5).tolist()
    [0.0, 0.0, 0.5, 1.0, 1.0]
    """
    high = high + 0.001 if low == high else high  # one step, not a division by zero
    return ((torch.arange(num, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


def yarn_mscale(factor: float, mscale: float = 1) -> float:
    """YaRN's attention temperature 0.1 mscale ln(factor) + 1 (1 when the factor does not stretch)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(params: dict) -> float:
    """What HF multiplies into cos and sin: `attention_factor` when given, else the mscales' ratio when both are
    set (DeepSeek), else `yarn_mscale(factor)`.

    >>> yarn_attention_factor({"factor": 4.0}) == 0.1 * math.log(4.0) + 1
    True
    """
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor, mscale, mscale_all_dim = float(params["factor"]), params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


@ROPE_TYPES.register("yarn")
def _yarn(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    base, dim, factor = float(params["rope_theta"]), 2 * inv_freq.numel(), float(params["factor"])
    old_context = float(params["original_max_position_embeddings"])
    low = yarn_dim(params.get("beta_fast") or 32, dim, base, old_context)
    high = yarn_dim(params.get("beta_slow") or 1, dim, base, old_context)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    kept = 1 - yarn_ramp(max(low, 0), min(high, dim - 1), dim // 2).to(inv_freq.device)  # extrapolation's share
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=inv_freq.device) / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept  # HF's order: the same roundings


def megatron_fields(hf: dict) -> dict:
    """TransformerConfig attributes that make megatron's attention multiply cos / sin by YaRN's attention factor
    (megatron's `_yarn_get_concentration_factor_from_config`: the same formula); {} for the other types.

    >>> megatron_fields({"rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": 1.0}})
    {'yarn_rotary_scaling_factor': 4.0, 'yarn_mscale': None, 'yarn_mscale_all_dim': None}
    """
    kind, params, _ = rope_parameters(hf)
    if kind != "yarn":
        return {}
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    both = bool(mscale and mscale_all_dim)  # HF's test: otherwise the factor alone sets it
    return {"yarn_rotary_scaling_factor": float(params["factor"]), "yarn_mscale": float(mscale) if both else None,
            "yarn_mscale_all_dim": float(mscale_all_dim) if both else None}


def attention_scaling(config) -> float:
    """The factor megatron's attention multiplies into cos and sin for this TransformerConfig (1.0 but for YaRN)."""
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_concentration_factor_from_config,
    )

    return _yarn_get_concentration_factor_from_config(config)


def apply_to(rotary, hf: dict) -> None:
    """Give megatron's `RotaryEmbedding` config.json's frequencies (before its first forward: it caches tables)."""
    rotary.inv_freq = scaled_inv_freq(hf, rotary.inv_freq)
