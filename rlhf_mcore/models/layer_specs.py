"""The transformer-layer ModuleSpec registry, by `model.attention_backend`: Transformer Engine when importable,
else megatron's local spec with SDPA core attention; `local` keeps megatron's stock attention (benchmarks
compare the two). Each builder takes the family's options (`ModelSpec.layer_options`: qk_layernorm,
num_experts). megatron is imported when a spec is built, so config validation can list the names without it."""
from __future__ import annotations

import importlib.util

from rlhf_mcore.registry import Registry

LAYER_SPECS: Registry = Registry("attention backend")


def have_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def backend_errors(name: str, window: int | None, source: str = "config.json") -> list[str]:
    """A sliding-window model (window: `transformer_config.sliding_window`) runs on our SDPA attention only: its
    masks (padded, packed, the native decoder's KV cache) are tested against transformers; TE's and megatron's
    local windows are not.

    >>> backend_errors("te", 8)[0].split(":")[0], backend_errors("auto", 8), backend_errors("te", None)
    ('model.attention_backend', [], [])
    """
    if window is None or name in ("auto", "sdpa"):
        return []
    return [f"model.attention_backend: {name} is not tested with sliding windows ({source}: sliding_window={window}) "
            f"(got {name}). Use model.attention_backend=sdpa (or auto)."]


def resolve_backend(name: str, window: int | None = None) -> str:
    """The backend that runs: auto = te where importable, else sdpa; sdpa for a sliding-window model."""
    errs = backend_errors(name, window)
    if errs:
        raise ValueError(errs[0])
    if name == "auto":
        return "te" if have_transformer_engine() and window is None else "sdpa"
    return name


@LAYER_SPECS.register("te")
def te_spec(qk_layernorm: bool = False, num_experts: int | None = None):
    if not have_transformer_engine():
        raise ValueError("model.attention_backend: 'te' needs transformer_engine, which is not importable "
                         "(got te). Install transformer-engine or use model.attention_backend=sdpa.")
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec(num_experts, qk_layernorm=qk_layernorm)


@LAYER_SPECS.register("local")
def local_spec(qk_layernorm: bool = False, num_experts: int | None = None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from rlhf_mcore.models.norm import RMSNorm

    spec = get_gpt_layer_local_spec(num_experts, normalization="RMSNorm", qk_layernorm=qk_layernorm)
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = RMSNorm  # sequence-parallel safe
    if qk_layernorm:  # RMSNorm over each query / key head (Qwen3); megatron sums their grads over TP by name
        attention = spec.submodules.self_attention.submodules
        attention.q_layernorm = attention.k_layernorm = RMSNorm
    return spec


@LAYER_SPECS.register("sdpa")
def sdpa_spec(qk_layernorm: bool = False, num_experts: int | None = None):
    from rlhf_mcore.models.attention import SDPAttention

    spec = local_spec(qk_layernorm=qk_layernorm, num_experts=num_experts)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec
