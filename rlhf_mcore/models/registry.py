"""The model-family registry: one `ModelSpec` (`models.spec`) per architecture, one file each under
`models/families/`, found from an HF `config.json`. Adding a family: its file, one entry below, its test.
"""
from __future__ import annotations

from rlhf_mcore.models.families import (
    llama,
    mistral,
    mixtral,
    qwen2,
    qwen2_5_vl,
    qwen3,
    qwen3_moe,
    qwen3_vl,
    qwen3_vl_moe,
)
from rlhf_mcore.models.spec import ModelSpec
from rlhf_mcore.registry import Registry

MODEL_FAMILIES: Registry[ModelSpec] = Registry("model family")

for _spec in (llama.SPEC, qwen2.SPEC, mistral.SPEC, qwen3.SPEC, qwen3_moe.SPEC, mixtral.SPEC, qwen2_5_vl.SPEC,
              qwen3_vl.SPEC, qwen3_vl_moe.SPEC):
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


def language_config(hf_cfg: dict, source: str = "config.json") -> dict:
    """The language model's config.json fields as one flat dict (its family's `text_config`: a vision-language
    config nests them under `text_config`); a text model's config as it is."""
    return spec_for_hf_config(hf_cfg, source).text_config(hf_cfg)
