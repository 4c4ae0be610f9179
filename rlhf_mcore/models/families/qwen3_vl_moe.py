"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, -235B-A22B): Qwen3-VL's vision tower (DeepStack) and interleaved M-RoPE around a
Qwen3-MoE language model, every layer a mixture of experts on megatron-core's MoE layer (`qwen3_moe.py`).

- Router: transformers' `Qwen3VLMoeTextTopKRouter` always renormalises the top-k probabilities (it has no
  `norm_topk_prob` switch): megatron's default, softmax over the top-k logits (`moe_router_pre_softmax=False`).
- Checkpoints store each layer's experts fused (`model.language_model.layers.N.mlp.experts.gate_up_proj` and
  `down_proj`), in the Hub's layout or transformers 5's (`models.fused_experts`): both load, read as the per-expert
  tensors of Qwen3-MoE's table; exports (and SGLang's start-up directory) write the Hub's layout.
- Decoded eagerly, like every MoE (the functional decode layer has dense MLPs only).
- Layouts: EP and PP (and DP); tp = 1, since megatron's MoE layer trains at tp > 1 only with sequence parallelism,
  which vision LMs do not take yet.
"""
from rlhf_mcore.models.families.vision_family import NESTED_ALIASES, NESTED_EXPORT, text_config
from rlhf_mcore.models.spec import NO_MLP, QK_NORMS, QWEN_EXPERTS, ModelSpec, num_experts

# Qwen3-VL's and Qwen3-MoE's own checks and fields are imported where called: a family file imports only leaves (the
# module-level import chain from the trainer stays within tests/unit/test_import_graph.py's limit)


def check(hf: dict, source: str) -> None:
    """Both halves' checks (Qwen3-VL's M-RoPE and biases, Qwen3-MoE's expert fields), one line each."""
    from rlhf_mcore.models.families import qwen3_moe, qwen3_vl

    errs = qwen3_vl.errors(hf, source) + qwen3_moe.expert_errors(hf, source)
    if errs:
        raise ValueError("\n".join(errs))


def config_fields(hf: dict) -> dict:
    from rlhf_mcore.models.families import qwen3_moe, qwen3_vl

    return {**qwen3_vl.config_fields(hf), **qwen3_moe.config_fields(hf), "moe_router_pre_softmax": False}


def layer_options(hf: dict) -> dict:
    return {"qk_layernorm": True, "num_experts": num_experts(hf)}


def run_errors(cfg) -> list[str]:
    """Qwen3-VL's, and tp = 1: megatron's MoE layer trains at tp > 1 only with sequence parallelism, which no vision LM
    takes yet (`vision_family.layout_errors`)."""
    from rlhf_mcore.models.families import qwen3_vl

    errs = qwen3_vl.run_errors(cfg)
    if cfg.parallel.tp > 1:
        errs.append(f"parallel.tp: Qwen3-VL-MoE trains at tp=1 for now (got {cfg.parallel.tp}): megatron's MoE layer "
                    "needs sequence parallelism at tp > 1, which vision LMs do not take yet. Split the experts with "
                    "parallel.ep and the layers with parallel.pp.")
    return errs


def stage_errors(hf: dict, parallel) -> list[str]:
    from rlhf_mcore.models.families import qwen3_vl

    return qwen3_vl.stage_errors(hf, parallel)


def tower_class():
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeVisionModel

    return Qwen3VLMoeVisionModel


SPEC = ModelSpec("qwen3_vl_moe", ("qwen3_vl_moe",), ("Qwen3VLMoeForConditionalGeneration",),
                 NO_MLP + QK_NORMS + QWEN_EXPERTS, check=check, config_fields=config_fields,
                 layer_options=layer_options, decode_paths=("eager",), text_config=text_config, run_errors=run_errors,
                 stage_errors=stage_errors, vision_prefix="visual.", vision_tower=tower_class,
                 checkpoint_aliases=NESTED_ALIASES, export_prefixes=NESTED_EXPORT, fused_experts=True)
