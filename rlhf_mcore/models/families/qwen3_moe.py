"""Qwen3-MoE: Qwen3's attention (q/k norm) with every layer's MLP a mixture of experts on megatron-core's
MoE layer (router + SequentialMLP experts, no Transformer Engine needed). Router: top-k of
`num_experts_per_tok`; `norm_topk_prob=true` renormalises the top-k probabilities (megatron's default: softmax
over the top-k logits), false keeps the full softmax's values (`moe_router_pre_softmax=True`). No load-balancing
loss in the forward (RL: coefficient 0). Decoded eagerly (the functional decode layer has dense MLPs only)."""
from rlhf_mcore.models.spec import (
    NO_MLP,
    QK_NORMS,
    QWEN_EXPERTS,
    ModelSpec,
    no_attention_bias,
    num_experts,
    switched_layers_slide,
)


def expert_errors(hf: dict, source: str) -> list[str]:
    """config.json's expert fields this family cannot convert, one line each."""
    errs = []
    if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
        errs.append(f"{source}: decoder_sparse_step={hf.get('decoder_sparse_step')} / mlp_only_layers="
                    f"{hf.get('mlp_only_layers')} (dense layers between MoE layers) are not supported. Use a model "
                    "whose every layer is MoE.")
    for key, value in (("num_experts", num_experts(hf)), ("num_experts_per_tok", hf.get("num_experts_per_tok")),
                       ("moe_intermediate_size", hf.get("moe_intermediate_size"))):
        if not isinstance(value, int) or value <= 0:
            errs.append(f"{source}: config field '{key}' is missing or not a positive int (got {value!r}).")
    return errs


def check(hf: dict, source: str) -> None:
    no_attention_bias(hf, source)
    errs = expert_errors(hf, source)
    if errs:
        raise ValueError("\n".join(errs))


def config_fields(hf: dict) -> dict:
    return {"qk_layernorm": True, "num_moe_experts": num_experts(hf), "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", False),
            "moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": None,
            "moe_grouped_gemm": False}


def layer_options(hf: dict) -> dict:
    return {"qk_layernorm": True, "num_experts": num_experts(hf)}


SPEC = ModelSpec("qwen3_moe", ("qwen3_moe",), ("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"),
                 NO_MLP + QK_NORMS + QWEN_EXPERTS, check=check, config_fields=config_fields,
                 layer_options=layer_options, decode_paths=("eager",),
                 sliding_layers=switched_layers_slide)
