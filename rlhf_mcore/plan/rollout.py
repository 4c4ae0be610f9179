"""The memory plan's rollout terms (native engine), from what `rollout.native` allocates.

- **Static decoder** (`rollout.static_decode`: the CUDA-graphed decode at TP = PP = 1 on a GPU): its state
  (`rollout.decode_state.DecodeState`) holds keys and values for a batch-size bucket of slots over the prompt +
  response budget, and response buffers. With `rollout.native.keep_graphs` (the default) the state, and with LoRA
  the decode step's merged weights (`rollout.merged_weights`: one more copy of every adapted linear), stay through
  every later phase of the step too: `resident_cache_bytes`.
- **Prefill**: the static decoder's prefill runs every row of a chunk through `layer_step` at once; inside a layer
  its locals live to its end (`prefill_layer_bytes`). Megatron's eager path (TP / PP > 1, no graphs, and the
  families that decode eagerly: MoE) holds one layer's forward tensors (`plan.dynamic.forward_layer_bytes`,
  an MoE layer's stacked expert weights too) and a KV cache of the chunk's rows.
- **Decode logits**: a decode step's fp32 logits over the vocabulary shard and the sampler's probabilities.
The rollout's transient peak is the larger of the prefill's layer step and the decode step's logits.
"""
from __future__ import annotations

from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape

BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)  # rollout.static_decode.BUCKETS
LONG = 8
FP32 = 4


def bucket_for(num_rows: int) -> int:
    """The static decoder's batch-size bucket (`rollout.static_decode.bucket_for`, without its imports).

    >>> bucket_for(3), bucket_for(512), bucket_for(1500)
    (4, 512, 1536)
    """
    return next((b for b in BUCKETS if b >= num_rows), -(-num_rows // 256) * 256)


def kv_cache_bytes(shape: Shape, rows: int, length: int, tp: int, pp: int, dtype: str) -> int:
    """Keys and values for `rows` rows of `length` tokens on one rank of a TP x PP layout.

    >>> s = Shape(layers=4, hidden=8, ffn=16, heads=2, groups=2, head_dim=4, vocab=10)
    >>> kv_cache_bytes(s, rows=3, length=5, tp=2, pp=2, dtype="bf16")  # 2 x 2 layers x 3 x 1 group x 5 x 4 x 2 B
    480
    """
    return 2 * (shape.layers // pp) * rows * max(shape.groups // tp, 1) * length * shape.head_dim * WEIGHT_BYTES[dtype]


def static_state_bytes(shape: Shape, rows: int, length: int, max_new: int, dtype: str) -> int:
    """`DecodeState.allocate` for `rows` rows: the KV cache at the rows' bucket, the per-slot tensors (5 long, one
    bool) and the response buffers of rows + bucket rows (tokens long, log-probs fp32, a length, a flag).

    >>> s = Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10)
    >>> static_state_bytes(s, rows=3, length=5, max_new=2, dtype="bf16")  # bucket 4: 320 + 4 x 41 + 8 x 33
    748
    """
    bucket = bucket_for(rows)
    out_rows = max(rows, bucket) + bucket
    return (kv_cache_bytes(shape, bucket, length, 1, 1, dtype) + bucket * (5 * LONG + 1)
            + out_rows * (max_new * (LONG + FP32) + LONG + 1))


def prefill_layer_bytes(shape: Shape, tokens: int, dtype: str, lora_fc1: bool = False) -> int:
    """The static decoder's prefill (`static_decode.layer_step`) at a layer's SwiGLU, per prompt token: the
    layer's input, the residual after attention, the input norm's output still bound to `x` and the pre-MLP norm's
    output (4 h); the fused q/k/v (held by the value's view), the rotated q and k, all live to the step's end
    ((2 heads + 3 groups) x head_dim); the MLP's peak (`plan.dynamic.forward_mlp_elements`: the prefill runs
    megatron's modules, LoRA hooks included).

    >>> prefill_layer_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10), 10, "bf16")
    ... # (4 x 8 + (2 x 2 + 3 x 1) x 4 + 3 x 16) x 10 x 2 B
    2160
    """
    from rlhf_mcore.plan.dynamic import forward_mlp_elements  # (lazy: the import graph's depth)

    elements = 4 * shape.hidden + (2 * shape.heads + 3 * shape.groups) * shape.head_dim + forward_mlp_elements(
        shape, 1, lora_fc1=lora_fc1)
    return elements * tokens * WEIGHT_BYTES[dtype]


def decode_logits_bytes(shape: Shape, rows: int, tp: int, divisible_by: int = 128) -> int:
    """A decode step's fp32 logits and sampling probabilities for `rows` rows.

    >>> decode_logits_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=2, head_dim=4, vocab=256), 2, 1)
    4096
    """
    from rlhf_mcore.plan.dynamic import vocab_shard

    return 2 * rows * vocab_shard(shape, tp, divisible_by) * FP32


def uses_static_decoder(cfg, shape: Shape, tp: int, pp: int) -> bool:
    """The native engine decodes with the static decoder (on a GPU; `NativeRollout._static_decoder`): not for a
    family whose `decode_paths` lacks it (MoE)."""
    return cfg.rollout.engine == "native" and cfg.rollout.native.cuda_graphs and tp == 1 and pp == 1 \
        and not cfg.actor.router_replay == "R3" and shape.static_decode


def lora_on_fc1(cfg) -> bool:
    """LoRA adapts the MLP's gate or up projection (megatron's linear_fc1), whose hook peaks a forward's MLP."""
    return "linear_fc1" in adapted_linears(cfg)


def adapted_linears(cfg) -> set[str]:
    """Megatron's linears (linear_qkv, linear_proj, linear_fc1, linear_fc2) with any projection LoRA adapts."""
    if not cfg.model.lora_rank:
        return set()
    from rlhf_mcore.models.lora import SUBS, LoraSettings

    targets = set(LoraSettings.from_model_cfg(cfg.model).target_modules)
    return {linear for linear, subs in SUBS.items() if targets & set(subs)}


def merged_lora_bytes(cfg, shape: Shape, dtype: str) -> int:
    """The static decoder's merged copies of the adapted linears' weights (LoRA; `rollout.merged_weights`)."""
    qkv = (shape.heads + 2 * shape.groups) * shape.head_dim * shape.hidden
    sizes = {"linear_qkv": qkv, "linear_proj": shape.heads * shape.head_dim * shape.hidden,
             "linear_fc1": 2 * shape.ffn * shape.hidden, "linear_fc2": shape.ffn * shape.hidden}
    return shape.layers * sum(sizes[k] for k in adapted_linears(cfg)) * WEIGHT_BYTES[dtype]


def rollout_terms(cfg, shape: Shape, rows: int, length: int, prompt: int, tp: int, pp: int, dtype: str,
                  divisible_by: int = 128, experts_per_token: int = 1, ep: int = 1) -> dict[str, int]:
    """The native engine's own terms during the rollout (weights and training state apart)."""
    from rlhf_mcore.plan.dynamic import forward_layer_bytes

    max_new = length - prompt
    logits = decode_logits_bytes(shape, rows, tp, divisible_by)
    lora_fc1 = lora_on_fc1(cfg)
    if uses_static_decoder(cfg, shape, tp, pp):
        terms = {"kv_cache": static_state_bytes(shape, rows, length, max_new, dtype),
                 "merged_lora": merged_lora_bytes(cfg, shape, dtype)}
        prefill = prefill_layer_bytes(shape, rows * prompt, dtype, lora_fc1)
    else:
        terms = {"kv_cache": kv_cache_bytes(shape, rows, length, tp, pp, dtype)}
        prefill = forward_layer_bytes(shape, rows * prompt, tp, dtype, experts_per_token, lora_fc1, ep)
    terms.update({"prefill": prefill} if prefill >= logits else {"decode_logits": logits})
    return {k: v for k, v in terms.items() if v}


def resident_cache_bytes(cfg, shape: Shape, rows: int, length: int, prompt: int, tp: int, pp: int,
                         dtype: str) -> int:
    """What the engine keeps after the rollout, through the other phases: the static decoder's state and merged
    LoRA weights with `rollout.native.keep_graphs`, else nothing (the KV cache is dropped at release)."""
    if not uses_static_decoder(cfg, shape, tp, pp) or not cfg.rollout.native.keep_graphs:
        return 0
    return static_state_bytes(shape, rows, length, length - prompt, dtype) + merged_lora_bytes(cfg, shape, dtype)
