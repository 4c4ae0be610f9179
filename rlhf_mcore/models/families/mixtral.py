"""Mixtral: Mistral's attention (no q/k norm, every layer within sliding_window when set) with a mixture of
experts in every layer on megatron-core's MoE layer. HF routes by softmax over all experts, top-k, then renormalises
the top-k: megatron's default (softmax over the top-k logits, `moe_router_pre_softmax=False`). Each expert's MLP is
intermediate_size wide (w1 gate, w3 up, w2 down). Decoded eagerly (the functional decode layer has dense MLPs only)."""
from rlhf_mcore.models.spec import (
    NO_MLP,
    H,
    L,
    ModelSpec,
    WeightRule,
    every_layer_slides,
    no_attention_bias,
    num_experts,
)

E, X = "mlp.experts.local_experts.{e}.", "block_sparse_moe."
EXPERTS = (
    WeightRule(L + "mlp.router.weight", (H + X + "gate.weight",), (("experts", "h"),)),
    WeightRule(L + E + "linear_fc1.weight", (H + X + "experts.{e}.w1.weight", H + X + "experts.{e}.w3.weight"),
               (("ffn", "h"), ("ffn", "h")), "gate_up"),
    WeightRule(L + E + "linear_fc2.weight", (H + X + "experts.{e}.w2.weight",), (("h", "ffn"),)),
)


def check(hf: dict, source: str) -> None:
    no_attention_bias(hf, source)
    if hf.get("router_jitter_noise"):
        raise ValueError(f"{source}: router_jitter_noise={hf['router_jitter_noise']} is not supported. Set it to 0.")
    if num_experts(hf) <= 0 or not hf.get("num_experts_per_tok"):
        raise ValueError(f"{source}: config fields 'num_local_experts' and 'num_experts_per_tok' must be positive "
                         f"(got {num_experts(hf)}, {hf.get('num_experts_per_tok')!r}).")


def config_fields(hf: dict) -> dict:
    return {"num_moe_experts": num_experts(hf), "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf["intermediate_size"], "moe_router_pre_softmax": False,
            "moe_grouped_gemm": False}


def layer_options(hf: dict) -> dict:
    return {"num_experts": num_experts(hf)}


SPEC = ModelSpec("mixtral", ("mixtral",), ("MixtralForCausalLM", "MixtralForSequenceClassification"),
                 NO_MLP + EXPERTS, sliding_layers=every_layer_slides, check=check, config_fields=config_fields,
                 layer_options=layer_options, decode_paths=("eager",))
