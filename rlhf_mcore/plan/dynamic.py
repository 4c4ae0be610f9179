"""The memory plan's per-phase terms on one rank: what each RL phase allocates on top of the resident weights,
gradients and optimizer state (`plan.static`). Formulas in the model's shapes; `tools/gpu` measures them.

- **KV cache** (rollout, native engine): keys and values of every layer of the stage for every decoded row over the
  prompt + response budget, in the model's dtype: `2 x layers x rows x groups/tp x length x head_dim` elements.
- **Decode logits**: a decode step's fp32 logits over the vocabulary shard and the sampler's probabilities.
- **Activations** (update): what a decoder layer keeps for its backward, per token, in the model's dtype: the two
  norms' inputs and outputs (4h), q, k, v and the attention output ((2 heads + 2 groups) x head_dim / tp), the
  MLP's gate and up outputs and their SwiGLU product (3 ffn / tp). With `model.recompute=full` a layer keeps only its
  input (h) and one layer's full set exists during its recompute.
- **Log-prob buffers**: the fused kernel's fp32 logits of one chunk of tokens over the vocabulary shard, twice
  (forward and, in the update, its gradient).
A forward-only pass (old / reference log-probs, values) keeps one layer's activations at a time.
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape

FP32 = 4
LOGPROB_CHUNK = 4096  # tokens per chunk of the fused log-prob kernel (models.logprobs.token_logprobs)


def kv_cache_bytes(shape: Shape, rows: int, length: int, tp: int, pp: int, dtype: str) -> int:
    """Keys and values for `rows` rows of `length` tokens on one rank of a TP x PP layout.

    >>> s = Shape(layers=4, hidden=8, ffn=16, heads=2, groups=2, head_dim=4, vocab=10)
    >>> kv_cache_bytes(s, rows=3, length=5, tp=2, pp=2, dtype="bf16")  # 2 x 2 layers x 3 x 1 group x 5 x 4 x 2 B
    480
    """
    return 2 * (shape.layers // pp) * rows * max(shape.groups // tp, 1) * length * shape.head_dim * WEIGHT_BYTES[dtype]


def vocab_shard(shape: Shape, tp: int, divisible_by: int = 128) -> int:
    """Rows of the output layer on one TP rank (the padded vocabulary split over TP)."""
    from rlhf_mcore.models.transformer_config import padded_vocab_size

    return padded_vocab_size(shape.vocab, divisible_by) // tp


def decode_logits_bytes(shape: Shape, rows: int, tp: int, divisible_by: int = 128) -> int:
    """A decode step's fp32 logits and sampling probabilities for `rows` rows.

    >>> decode_logits_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=2, head_dim=4, vocab=256), 2, 1)
    4096
    """
    return 2 * rows * vocab_shard(shape, tp, divisible_by) * FP32


def layer_activation_elements(shape: Shape, tp: int) -> int:
    """Elements one decoder layer keeps for its backward, per token.

    >>> layer_activation_elements(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10), tp=1)
    104

    (4 x 8 norms, (2 x 2 + 2 x 1) x 4 = 24 attention, 3 x 16 = 48 MLP.)
    """
    ffn = shape.moe_ffn if shape.experts else shape.ffn  # an MoE token goes through its top-k experts' MLPs
    attention = (2 * shape.heads + 2 * shape.groups) * shape.head_dim // tp
    return 4 * shape.hidden + attention + 3 * ffn // tp


def activation_bytes(shape: Shape, tokens: int, tp: int, pp: int, dtype: str, recompute: str,
                     experts_per_token: int = 1) -> int:
    """What the update's forward keeps for the backward on one rank, for a micro-batch of `tokens` tokens (the
    first stage's layers; 1F1B keeps up to PP micro-batches in flight on it).

    >>> s = Shape(layers=2, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10)
    >>> activation_bytes(s, tokens=10, tp=1, pp=1, dtype="bf16", recompute="none")
    4160
    >>> activation_bytes(s, tokens=10, tp=1, pp=1, dtype="bf16", recompute="full")  # inputs + one layer's set
    2400
    """
    per_layer = layer_activation_elements(shape, tp)
    if shape.experts:  # the MoE MLP part runs once per chosen expert
        dense = per_layer - 3 * shape.moe_ffn // tp
        per_layer = dense + experts_per_token * 3 * shape.moe_ffn // tp
    layers = shape.layers // pp
    in_flight = pp  # 1F1B: the first stage holds PP micro-batches' activations at its peak
    kept = layers * shape.hidden + per_layer if recompute == "full" else layers * per_layer
    return kept * tokens * in_flight * WEIGHT_BYTES[dtype]


def logprob_bytes(shape: Shape, tokens: int, tp: int, backward: bool, divisible_by: int = 128) -> int:
    """The fused log-prob kernel's fp32 logits of one chunk (and their gradient in the update).

    >>> logprob_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=256), 10, 1, True)
    20480
    """
    chunk = min(tokens, LOGPROB_CHUNK)
    return chunk * vocab_shard(shape, tp, divisible_by) * FP32 * (2 if backward else 1)


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the dynamic terms depend on, from a config at a DP size."""

    rows: int  # rows one rank decodes at once
    length: int  # prompt + response budget
    update_tokens: int  # tokens of one update micro-batch
    forward_tokens: int  # tokens of one forward-only micro-batch (old / ref log-probs, values)

    @classmethod
    def of(cls, cfg, dp: int) -> "Batch":
        length = cfg.data.max_prompt_length + cfg.rollout.max_response_length
        rows = -(-cfg.data.train_batch_size * cfg.rollout.n // dp)
        if cfg.rollout.micro_batch_size:
            rows = min(rows, cfg.rollout.micro_batch_size)
        a = cfg.actor
        by_tokens = a.use_dynamic_bsz or cfg.data.use_sequence_packing
        update = a.max_tokens_per_gpu if by_tokens and a.max_tokens_per_gpu else a.micro_batch_size_per_gpu * length
        forward = a.log_prob_max_tokens_per_gpu if by_tokens and a.log_prob_max_tokens_per_gpu else update
        return cls(rows=rows, length=length, update_tokens=update, forward_tokens=forward)
