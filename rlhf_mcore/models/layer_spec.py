"""Choose the transformer-layer ModuleSpec: Transformer Engine when importable, else megatron's local
spec with SDPA core attention. `local` keeps megatron's stock attention (benchmarks compare the two)."""
from __future__ import annotations

import importlib.util
import logging

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from rlhf_mcore.models.attention import SDPAttention
from rlhf_mcore.models.init import seeded_layer_spec
from rlhf_mcore.models.norm import RMSNorm
from rlhf_mcore.registry import Registry

log = logging.getLogger(__name__)
LAYER_SPECS: Registry = Registry("attention backend")


def have_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


@LAYER_SPECS.register("te")
def te_spec():
    if not have_transformer_engine():
        raise ValueError("model.attention_backend: 'te' needs transformer_engine, which is not importable "
                         "(got te). Install transformer-engine or use model.attention_backend=sdpa.")
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec()


@LAYER_SPECS.register("local")
def local_spec():
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = RMSNorm  # sequence-parallel safe
    return spec


@LAYER_SPECS.register("sdpa")
def sdpa_spec():
    spec = local_spec()
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def block_spec(layer_spec, backend: str, config, pp_rank: int):
    """This stage's layers plus the final norm (ours, except with Transformer Engine)."""
    if backend == "te":
        return layer_spec
    num = get_num_layers_to_build(config, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * num, layer_norm=RMSNorm)


def resolve_backend(name: str) -> str:
    if name == "auto":
        return "te" if have_transformer_engine() else "sdpa"
    return name


def choose_layer_spec(name: str):
    """(ModuleSpec, backend name actually used)."""
    backend = resolve_backend(name)
    return seeded_layer_spec(LAYER_SPECS.get(backend)()), backend
