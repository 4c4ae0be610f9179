"""Qwen2 / Qwen2.5: Llama's table plus q/k/v biases (fused like the weights); attention_bias is implied."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, QKV_BIAS, ModelSpec, typed_layers_slide


def _no_check(hf: dict, source: str) -> None:
    return None  # Qwen2's attention_bias flag means the q/k/v biases, which convert


SPEC = ModelSpec("qwen2", ("qwen2",), ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
                 BASE_WEIGHTS + (QKV_BIAS,), qkv_bias=True, check=_no_check,
                 sliding_layers=typed_layers_slide)
