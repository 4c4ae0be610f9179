"""Qwen2.5-VL: the language model is Qwen2 (q/k/v biases) with multimodal RoPE, the vision tower transformers' own
(`models.vision`). config.json nests the LM's fields under `text_config` (transformers >= 5) or keeps them at the top
level (the Hub's files); `text_config` flattens both. M-RoPE's `mrope_section` (temporal, height, width frequency
counts) becomes megatron's `mrope_section`: the build then picks megatron's `MultimodalRotaryEmbedding`, which takes
[3, B, S] positions (`models.mrope`). Checkpoints store the LM as `model.*` (the Hub's, and what transformers 5
writes) or `model.language_model.*` (transformers 4.5x); the vision tower as `visual.*` or `model.visual.*`.
"""
from rlhf_mcore.models.families.vision_family import mrope_errors, mrope_section, text_config, vision_run_errors
from rlhf_mcore.models.spec import BASE_WEIGHTS, QKV_BIAS, ModelSpec


def check(hf: dict, source: str) -> None:
    """What this converter cannot honour, one line each (config.json fields of the flat config)."""
    errs = mrope_errors(hf, source, mrope_section(hf), "Qwen2.5-VL")
    if hf.get("use_sliding_window"):
        errs.append(f"{source}: use_sliding_window=true is not supported for Qwen2.5-VL (got true). Set it false.")
    if errs:
        raise ValueError("\n".join(errs))


def config_fields(hf: dict) -> dict:
    return {"mrope_section": mrope_section(hf)}


def run_errors(cfg) -> list[str]:
    return vision_run_errors(cfg, "Qwen2.5-VL")


def tower_class():
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    return Qwen2_5_VisionTransformerPretrainedModel


SPEC = ModelSpec("qwen2_5_vl", ("qwen2_5_vl",), ("Qwen2_5_VLForConditionalGeneration",),
                 BASE_WEIGHTS + (QKV_BIAS,), qkv_bias=True, check=check, config_fields=config_fields,
                 text_config=text_config, run_errors=run_errors, vision_prefix="visual.", vision_tower=tower_class,
                 checkpoint_aliases=(("model.language_model.", "model."), ("model.visual.", "visual.")))
