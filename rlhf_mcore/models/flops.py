"""Model FLOPs of a decoder (dense, or MoE by its active parameters: the top-k experts), from its HF config
dict, and the devices' peak rates: `perf/mfu/*`.

MFU = model FLOPs of the tokens a phase processed / (phase seconds x world size x the device's peak), the
definition verl's `perf/mfu/actor` uses (PaLM's, appendix B): matmul FLOPs of the parameters (2 per weight
and token forward, 3x that for forward + backward) plus attention's QK^T and AV over the sequence.
"""
from __future__ import annotations

from rlhf_mcore.models.families.vision_family import text_config

# dense bf16 tensor-core peaks (vendor figures, no sparsity), matched by substring of the device name
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
                   "L40S": 362e12, "B200": 2250e12}


def mlp_params_per_token(hf: dict) -> int:
    """The MLP weights one token multiplies by in one layer: gate/up/down of the dense MLP, or of an MoE
    layer's top-k experts (`num_experts_per_tok` x `moe_intermediate_size`, plus a shared expert where the
    config has one) and its router: active parameters, not all experts.

    >>> mlp_params_per_token({"hidden_size": 4, "intermediate_size": 8})
    96
    >>> mlp_params_per_token({"hidden_size": 4, "intermediate_size": 8, "num_experts": 16, "num_experts_per_tok": 2,
    ...                       "moe_intermediate_size": 3})  # 2 experts x 3 x 4 x 3 + router 4 x 16
    136
    """
    h = hf["hidden_size"]
    experts = hf.get("num_experts") or hf.get("num_local_experts") or 0
    if not experts:
        return 3 * h * hf["intermediate_size"]
    shared = hf.get("shared_expert_intermediate_size") or 0
    return 3 * h * (hf["num_experts_per_tok"] * hf["moe_intermediate_size"] + shared) + h * experts


def forward_flops_per_token(hf: dict, seq_len: float) -> float:
    """Forward FLOPs of one token at a context of `seq_len` (the mean row length of the batch). A vision LM's
    config.json (its LM's fields under `text_config`) counts its language model; the tower's FLOPs are not here.

    >>> hf = {"hidden_size": 4, "num_hidden_layers": 1, "intermediate_size": 8, "num_attention_heads": 2,
    ...       "num_key_value_heads": 1, "vocab_size": 10}
    >>> forward_flops_per_token(hf, 3)  # 2 x (32 q/o + 16 k/v + 96 mlp + 40 head) + 2 x 2 x 4 x 3 attention
    416.0
    """
    hf = text_config(hf)
    h, layers, vocab = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or h // heads
    kv = (hf.get("num_key_value_heads") or heads) * head_dim
    q = heads * head_dim
    per_layer = 2 * h * q + 2 * h * kv + mlp_params_per_token(hf)  # q and o, k and v, gate/up/down
    attention = 2 * 2 * layers * q * seq_len  # QK^T and AV
    return float(2 * (layers * per_layer + h * vocab) + attention)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The device's dense peak for `dtype` (model.dtype), or None where unknown (CPU, fp32 runs)."""
    if dtype != "bf16":
        return None
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_name.upper()), None)


def mfu(hf: dict, num_tokens: float, seq_len: float, passes: float, seconds: float, world_size: int,
        peak: float | None) -> float | None:
    """Model FLOPs utilisation of `passes` forward-equivalents (forward 1, forward + backward 3) over the
    world's `num_tokens` in `seconds`; None without a known peak.

    >>> round(mfu({"hidden_size": 4, "num_hidden_layers": 1, "intermediate_size": 8, "num_attention_heads": 2,
    ...            "num_key_value_heads": 1, "vocab_size": 10}, 1000, 3, 3, 1.0, 2, 1e6), 3)
    0.624
    """
    if peak is None or seconds <= 0:
        return None
    return forward_flops_per_token(hf, seq_len) * num_tokens * passes / (seconds * world_size * peak)
