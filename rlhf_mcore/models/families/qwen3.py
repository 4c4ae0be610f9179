"""Qwen3 dense: Llama's table plus an RMSNorm over each query and key head (megatron `qk_layernorm`, applied
before RoPE), no QKV bias, and a head_dim that may differ from hidden / heads (config.json head_dim)."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, QK_NORMS, ModelSpec, no_attention_bias, typed_layers_slide


def qk_layernorm(hf: dict) -> dict:
    return {"qk_layernorm": True}


SPEC = ModelSpec("qwen3", ("qwen3",), ("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
                 BASE_WEIGHTS + QK_NORMS, check=no_attention_bias, config_fields=qk_layernorm,
                 layer_options=qk_layernorm, sliding_layers=typed_layers_slide)
