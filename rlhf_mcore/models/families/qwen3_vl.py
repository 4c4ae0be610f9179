"""Qwen3-VL (dense): the language model is Qwen3 (per-head q/k RMSNorm before RoPE, no biases, head_dim from
config.json) with *interleaved* M-RoPE, the vision tower transformers' `Qwen3VLVisionModel` with DeepStack.

- Rotary: transformers assigns frequency j to h when j % 3 == 1 and j < 3 * s_h, to w when j % 3 == 2 and j < 3 * s_w,
  to t otherwise (`Qwen3VLTextRotaryEmbedding`). Megatron's `MultimodalRotaryEmbedding` gives contiguous chunk i to
  axis i % 3, so the section becomes chunk sizes with zero-size chunks (`models.mrope.interleaved_mrope_section`):
  the same cos / sin table, no new module and no weight permutation.
- DeepStack: the tower returns, beside the merged image embeddings, one more embedding per
  `vision_config.deepstack_visual_indexes` entry; level k is added to the hidden states at the image tokens after LM
  layer k (`models.vision`: forward hooks on those decoder layers). They must sit on the first pipeline stage, with
  the tower.
- config.json: transformers 5 nests the LM under `text_config` with `rope_parameters`; the Hub's files say
  `rope_scaling` and `mrope_interleaved: true`, which SGLang reads (transformers always interleaves). Checkpoints name
  the LM `model.language_model.*` and the tower `model.visual.*` (aliased to the table's `model.*` and `visual.*`).
Docs: docs/qwen3_vl_research.md.
"""
from rlhf_mcore.models.families.vision_family import (
    NESTED_ALIASES,
    NESTED_EXPORT,
    mrope_errors,
    mrope_section,
    rope_fields,
    text_config,
    vision_run_errors,
)
from rlhf_mcore.models.mrope import interleaved_mrope_section
from rlhf_mcore.models.spec import BASE_WEIGHTS, QK_NORMS, ModelSpec

DEFAULT_SECTION = (24, 20, 20)  # transformers' Qwen3VLTextRotaryEmbedding when config.json has none


def section(hf: dict) -> list[int]:
    return mrope_section(hf) or list(DEFAULT_SECTION)


def errors(hf: dict, source: str) -> list[str]:
    """What this converter cannot honour, one line each (config.json fields of the flat config)."""
    errs = mrope_errors(hf, source, section(hf), "Qwen3-VL")
    if any(p.get("mrope_interleaved") is False for _, p in rope_fields(hf)):
        errs.insert(1, f"{source}: rope mrope_interleaved=false is not Qwen3-VL's layout (got false): transformers "
                    "always interleaves, SGLang would not. Remove the field or set it true.")
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field):
            errs.append(f"{source}: config field '{field}'=true is not supported for Qwen3-VL (got true). Use the "
                        "model's own config.json.")
    return errs


def check(hf: dict, source: str) -> None:
    errs = errors(hf, source)
    if errs:
        raise ValueError("\n".join(errs))


def config_fields(hf: dict) -> dict:
    return {"qk_layernorm": True, "mrope_section": interleaved_mrope_section(tuple(section(hf)))}


def qk_layernorm(hf: dict) -> dict:
    return {"qk_layernorm": True}


def run_errors(cfg) -> list[str]:
    """Every vision LM's limits (`vision_family.RUN_LIMITS`), and a full recompute at pp > 1, which would re-run a
    DeepStack layer with a later micro-batch's features (1F1B runs several forwards on the first stage first)."""
    errs = vision_run_errors(cfg, "Qwen3-VL")
    if cfg.parallel.pp > 1 and cfg.model.recompute == "full":
        errs.append(f"model.recompute: full recompute with Qwen3-VL's DeepStack runs at parallel.pp=1 only for now "
                    f"(got full at parallel.pp={cfg.parallel.pp}). Use model.recompute=selective or none.")
    return errs


def stage_errors(hf: dict, parallel) -> list[str]:
    """DeepStack adds to LM layers 0 .. n-1 on the first pipeline stage, where the tower runs (`models.vision`
    refuses it again at build); stages hold layers / pp each (`config.validate`)."""
    levels = len((hf.get("vision_config") or {}).get("deepstack_visual_indexes") or ())
    layers = hf.get("num_hidden_layers") or 0
    if parallel.pp > 1 and levels and layers // parallel.pp < levels:
        return [f"parallel.pp: Qwen3-VL's DeepStack adds to LM layers 0..{levels - 1}, which must all sit on the first "
                f"pipeline stage (got {layers // parallel.pp} layer(s) a stage at parallel.pp={parallel.pp}). Use "
                f"parallel.pp <= {max(layers // levels, 1)}."]
    return []


def tower_class():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    return Qwen3VLVisionModel


SPEC = ModelSpec("qwen3_vl", ("qwen3_vl",), ("Qwen3VLForConditionalGeneration",), BASE_WEIGHTS + QK_NORMS,
                 check=check, config_fields=config_fields, layer_options=qk_layernorm,
                 text_config=text_config, run_errors=run_errors, stage_errors=stage_errors, vision_prefix="visual.",
                 vision_tower=tower_class,
                 checkpoint_aliases=NESTED_ALIASES, export_prefixes=NESTED_EXPORT)
