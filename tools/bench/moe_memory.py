"""How many layers of a model fit one GPU for training (bench_moe_step's `--find-largest` and default layers).

Persistent state per parameter, megatron's distributed optimizer with bf16 weights at dp 1 (nothing sharded):
2 (bf16 weight) + 4 (fp32 main grad, grad_reduce_in_fp32) + 4 (fp32 master) + 8 (Adam m, v fp32) = 18 bytes.
Activations per token and layer are estimated from what the autograd graph keeps (bf16: the layer input,
norms, q/k/v before and after the q/k norm and RoPE, attention output, router logits and probabilities, the
k routed copies of the token, fc1's [gate; up] and fc2's output, SequentialMLP's activation); the output head
keeps one chunk of fp32 logits. The optimizer step has its own peak: without TE or apex megatron uses torch's
AdamW, whose multi-tensor path allocates sqrt(v) for all parameters at once (4 bytes per parameter), after the
activations are freed. The peak is the larger of the two. The benchmark measures both peaks at two layer counts
and fits a line through each (`fit_largest`), which is what it states.
"""
from __future__ import annotations

BYTES_PER_PARAM = 18
GIB = 2**30


def num_experts(hf: dict) -> int:
    return hf.get("num_experts") or hf.get("num_local_experts") or 0


def layer_params(hf: dict) -> int:
    """Parameters of one decoder layer (all experts, not just the active ones).

    >>> layer_params({"hidden_size": 4, "intermediate_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1})
    152
    """
    h, heads = hf["hidden_size"], hf["num_attention_heads"]
    d = hf.get("head_dim") or h // heads
    q, kv = heads * d, (hf.get("num_key_value_heads") or heads) * d
    attention = 2 * h * q + 2 * h * kv + (2 * d if hf.get("model_type") in ("qwen3", "qwen3_moe") else 0)
    if hf.get("model_type") == "qwen2":
        attention += q + 2 * kv  # q/k/v biases
    experts = num_experts(hf)
    mlp = experts * 3 * h * hf["moe_intermediate_size"] + h * experts if experts else 3 * h * hf["intermediate_size"]
    return attention + mlp + 2 * h  # + the two RMSNorms


def outside_params(hf: dict) -> int:
    """Embedding, output layer (unless tied) and final norm."""
    v, h = hf["vocab_size"], hf["hidden_size"]
    return v * h * (1 if hf.get("tie_word_embeddings") else 2) + h


def activation_bytes_per_token_layer(hf: dict) -> int:
    h, heads = hf["hidden_size"], hf["num_attention_heads"]
    d = hf.get("head_dim") or h // heads
    q, kv = heads * d, (hf.get("num_key_value_heads") or heads) * d
    attention = 2 * (2 * h + 2 * (q + 2 * kv) + (q + kv) + 2 * q)  # input, norm, qkv x2, q/k norm, out x2
    experts = num_experts(hf)
    if not experts:
        f = hf["intermediate_size"]
        return attention + 2 * (2 * h + 2 * f + f + h)
    k, f = hf["num_experts_per_tok"], hf["moe_intermediate_size"]
    return attention + 2 * (3 * h) + 12 * experts + k * 2 * (2 * h + 2 * f + f)


def training_bytes(hf: dict, layers: int, tokens_per_micro: int) -> int:
    """Estimated peak bytes of one training step of `layers` layers at `tokens_per_micro` tokens per micro-batch."""
    params = outside_params(hf) + layers * layer_params(hf)
    logits = 4096 * hf["vocab_size"] * 4 * 2  # one 4096-token chunk of fp32 logits and its softmax
    forward_backward = layers * tokens_per_micro * activation_bytes_per_token_layer(hf) + logits
    return BYTES_PER_PARAM * params + max(forward_backward, 4 * params)  # 4 * params: AdamW's sqrt(v)


def largest_layers(hf: dict, tokens_per_micro: int, capacity_bytes: float) -> int:
    """The most layers whose estimate fits `capacity_bytes` (0 when not even one does).

    >>> hf = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "vocab_size": 32}
    >>> n = largest_layers(hf, 4, 2e6)
    >>> n > 0 and training_bytes(hf, n, 4) <= 2e6 < training_bytes(hf, n + 1, 4)
    True
    """
    layers = 0
    while training_bytes(hf, layers + 1, tokens_per_micro) <= capacity_bytes:
        layers += 1
    return layers


def fit_largest(points: list[tuple[int, float]], capacity_bytes: float) -> tuple[int, float, float]:
    """(largest layers, intercept bytes, bytes per layer) from measured (layers, peak bytes) at two layer counts.

    >>> fit_largest([(2, 30.0), (9, 100.0)], 125.0)
    (11, 10.0, 10.0)
    """
    (l0, p0), (l1, p1) = sorted(points)[0], sorted(points)[-1]
    slope = (p1 - p0) / (l1 - l0)
    intercept = p0 - slope * l0
    return int((capacity_bytes - intercept) // slope), intercept, slope
