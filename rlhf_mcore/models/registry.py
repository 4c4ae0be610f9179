"""The model-family registry: one `ModelSpec` per architecture, found from an HF `config.json`.

All three families share megatron's GPT structure (RMSNorm, RoPE, SwiGLU, GQA); a spec says what differs
(QKV bias, sliding window) and which weight-map table converts its checkpoints
(`rlhf_mcore.models.weights`).
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.registry import Registry


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str  # registry key
    model_types: tuple[str, ...]  # HF config.json "model_type" values this spec reads
    architectures: tuple[str, ...]  # HF "architectures" entries (causal LM and sequence classification)
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2); o_proj and MLP never do
    has_sliding_window: bool = False  # honours config.json sliding_window (Mistral): it must cover the sequence


MODEL_FAMILIES: Registry[ModelSpec] = Registry("model family")

for _spec in (
    ModelSpec("llama", ("llama",), ("LlamaForCausalLM", "LlamaForSequenceClassification"), qkv_bias=False),
    ModelSpec("qwen2", ("qwen2",), ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"), qkv_bias=True),
    ModelSpec("mistral", ("mistral",), ("MistralForCausalLM", "MistralForSequenceClassification"),
              qkv_bias=False, has_sliding_window=True),
):
    MODEL_FAMILIES.register(_spec.name)(_spec)


def spec_for_hf_config(hf_cfg: dict, source: str = "config.json") -> ModelSpec:
    """The registered spec whose architectures (or model_type) match an HF config dict."""
    archs = hf_cfg.get("architectures") or []
    model_type = hf_cfg.get("model_type")
    specs = [MODEL_FAMILIES.get(name) for name in MODEL_FAMILIES]
    for spec in specs:  # the architectures list wins over model_type
        if any(a in spec.architectures for a in archs):
            return spec
    for spec in specs:
        if model_type in spec.model_types:
            return spec
    known = sorted(a for n in MODEL_FAMILIES for a in MODEL_FAMILIES.get(n).architectures)
    raise ValueError(
        f"{source}: unsupported architecture (architectures={archs}, model_type={model_type!r}). "
        f"Supported: {', '.join(known)}."
    )
