"""The memory plan's per-phase terms on one rank: what each RL phase allocates on top of the resident weights,
gradients and optimizer state (`plan.static`). Formulas in the model's shapes, each derived from what the code
allocates (the tensors autograd saves, the live locals of a forward); `tools/gpu` measures them.

- **Activations** (update): what a decoder layer keeps for its backward, per token (`layer_activation_bytes`).
  With `model.recompute=full` a layer keeps only its input (h) and one layer's full set exists during its recompute.
- **Head** (update): the final norm's input and the hidden states the fused log-prob kernel saves.
- **Log-prob buffers**: the fused kernel's fp32 logits of one chunk; in the update's backward also its gradient in
  the weight's dtype, the fp32 gradients of the hidden states and of the output weight (`logprob_backward_bytes`).
- **Forward-only** passes (old / reference log-probs, values) hold one layer's live tensors at a time
  (`forward_layer_bytes`).
The rollout's terms (KV cache, prefill, decode logits) are in `plan.rollout`.
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape

FP32 = 4
LOGPROB_CHUNK = 4096  # tokens per chunk of the fused log-prob kernel (models.logprobs.token_logprobs)


def vocab_shard(shape: Shape, tp: int, divisible_by: int = 128) -> int:
    """Rows of the output layer on one TP rank (the padded vocabulary split over TP)."""
    from rlhf_mcore.models.transformer_config import padded_vocab_size

    return padded_vocab_size(shape.vocab, divisible_by) // tp


def mlp_elements(shape: Shape, tp: int, experts_per_token: int = 1) -> int:
    """Elements the MLP keeps per token: the fc1 (gate | up) output that megatron's fused SwiGLU saves (2 ffn)
    and its product, fc2's input (ffn); an MoE token has them for each of its top-k experts."""
    if shape.experts:
        return experts_per_token * 3 * shape.moe_ffn // tp
    return 3 * shape.ffn // tp


def layer_activation_bytes(shape: Shape, tp: int, dtype: str, out_copy: bool = False,
                           experts_per_token: int = 1) -> int:
    """Bytes one decoder layer keeps for its backward, per token, on one TP rank (megatron's local spec with our
    SDPA attention, as on a GPU: torch's fused RMSNorm, megatron's fused SwiGLU):
    - the two RMSNorms' inputs (2 h) and fp32 rstd (2 x 4 B); the q/k/v and fc1 linears' inputs (2 h);
    - the fused q/k/v output ((heads + 2 groups) x head_dim: the value is a view of it, so attention keeps it
      whole), the rotated q and k ((heads + groups) x head_dim), the attention output (heads x head_dim, also
      linear_proj's input) and its fp32 log-sum-exp (4 B a head);
    - `out_copy`: padded micro-batches run SDPA's flash / efficient kernels, whose [b, s, heads, d] output
      becomes linear_proj's [s, b, heads x d] input through a copy (heads x head_dim more); the packed varlen
      kernel's [T, heads, d] output reshapes in place;
    - the MLP (`mlp_elements`).

    >>> s = Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10)
    >>> layer_activation_bytes(s, tp=1, dtype="bf16")  # (4 x 8 + (3 x 2 + 3 x 1) x 4 + 3 x 16) x 2 + 8 + 2 x 4
    248
    >>> layer_activation_bytes(s, tp=1, dtype="bf16", out_copy=True) - 248  # 2 heads x 4 x 2 B
    16
    """
    heads, groups = shape.heads // tp, max(shape.groups // tp, 1)
    elements = 4 * shape.hidden + (3 * heads + 3 * groups) * shape.head_dim + mlp_elements(
        shape, tp, experts_per_token)
    elements += heads * shape.head_dim if out_copy else 0
    return elements * WEIGHT_BYTES[dtype] + 2 * FP32 + heads * FP32


def activation_bytes(shape: Shape, tokens: int, tp: int, pp: int, dtype: str, recompute: str,
                     experts_per_token: int = 1, out_copy: bool = False) -> int:
    """What the update's forward keeps for the backward on one rank, for a micro-batch of `tokens` tokens (the
    first stage's layers; 1F1B keeps up to PP micro-batches in flight on it).

    >>> s = Shape(layers=2, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10)
    >>> activation_bytes(s, tokens=10, tp=1, pp=1, dtype="bf16", recompute="none")  # 2 layers x 10 x 248
    4960
    >>> activation_bytes(s, tokens=10, tp=1, pp=1, dtype="bf16", recompute="full")  # inputs + one layer's set
    2800
    """
    per_layer = layer_activation_bytes(shape, tp, dtype, out_copy, experts_per_token)
    layers = shape.layers // pp
    in_flight = pp  # 1F1B: the first stage holds PP micro-batches' activations at its peak
    kept = layers * shape.hidden * WEIGHT_BYTES[dtype] + per_layer if recompute == "full" else layers * per_layer
    return kept * tokens * in_flight


def head_activation_bytes(shape: Shape, tokens: int, dtype: str) -> int:
    """What the last stage keeps past the layers, per micro-batch: the final RMSNorm's input (h) and fp32 rstd, and
    the hidden states the fused log-prob kernel saves (h; a critic's value head saves them alike).

    >>> head_activation_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10), 10, "bf16")
    360
    """
    return tokens * (2 * shape.hidden * WEIGHT_BYTES[dtype] + FP32)


def forward_mlp_elements(shape: Shape, tp: int, experts_per_token: int = 1, lora_fc1: bool = False) -> int:
    """Elements live per token at the MLP's peak in a forward without autograd.
    - Dense: fc1's output and the SwiGLU product (`mlp_elements`). With LoRA on fc1 (`models.lora._column_hook`),
      at the hook's sum: the base output, the adapters' per-projection parts, their join, its scaled copy and the
      sum, 5 x 2 ffn.
    - MoE (megatron's alltoall dispatcher, our grouped experts; at fc2): per routed copy of a token, the permuted
      token and its by-expert sorted copy (`MoELayer.forward` keeps the first bound while the experts run), fc1's
      output (2 moe_ffn), the weighted SwiGLU (moe_ffn) and fc2's output (h).

    >>> s = Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10)
    >>> forward_mlp_elements(s, 1), forward_mlp_elements(s, 1, lora_fc1=True)  # 3 x 16; 10 x 16
    (48, 160)
    >>> forward_mlp_elements(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10, experts=4,
    ...                            moe_ffn=6), 1, experts_per_token=2)  # 2 x (3 x 8 + 3 x 6)
    84
    """
    if shape.experts:
        return experts_per_token * (3 * shape.hidden + 3 * shape.moe_ffn // tp)
    return (10 if lora_fc1 else 3) * shape.ffn // tp


def expert_stack_bytes(shape: Shape, ep: int, dtype: str) -> int:
    """The grouped experts' stacked weights (`models.experts_grouped._GroupedSwiGLU`: torch.stack of every local
    expert's fc1 [2F, H] and fc2 [H, F]), live while a layer's experts run.

    >>> expert_stack_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10, experts=4,
    ...                          moe_ffn=6), 2, "bf16")  # 2 local experts x 3 x 6 x 8 x 2 B
    576
    """
    return (shape.experts // ep) * 3 * shape.moe_ffn * shape.hidden * WEIGHT_BYTES[dtype] if shape.experts else 0


def forward_layer_bytes(shape: Shape, tokens: int, tp: int, dtype: str, experts_per_token: int = 1,
                        lora_fc1: bool = False, ep: int = 1) -> int:
    """A forward-only pass's live tensors in its largest layer step (no autograd: each layer's tensors are freed
    when it returns): the layer's input (held by the block), the residual and the pre-MLP norm's output (3 h),
    and the MLP's peak (`forward_mlp_elements`); or, in the attention, the input, the norm's output and
    the projection's output (3 h), the fused q/k/v, the query's reshaped copy and rotation, the rotated key and
    the attention output ((4 heads + 3 groups) x head_dim), if larger; an MoE layer's stacked expert weights on
    top (`expert_stack_bytes`, `ep` ranks sharing the experts).

    >>> forward_layer_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=10), 10, 1, "bf16")
    1440
    """
    heads, groups = shape.heads // tp, max(shape.groups // tp, 1)
    mlp = 3 * shape.hidden + forward_mlp_elements(shape, tp, experts_per_token, lora_fc1)
    attention = 3 * shape.hidden + (4 * heads + 3 * groups) * shape.head_dim
    return max(mlp, attention) * tokens * WEIGHT_BYTES[dtype] + expert_stack_bytes(shape, ep, dtype)


def logprob_bytes(shape: Shape, tokens: int, tp: int, divisible_by: int = 128) -> int:
    """The fused log-prob kernel's forward: the fp32 logits of one chunk over the vocabulary shard.

    >>> logprob_bytes(Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=256), 10, 1)
    10240
    """
    return min(tokens, LOGPROB_CHUNK) * vocab_shard(shape, tp, divisible_by) * FP32


def logprob_backward_bytes(shape: Shape, tokens: int, tp: int, dtype: str, head_trained: bool = True,
                           divisible_by: int = 128) -> int:
    """The fused kernel's backward (`kernels.fused_logprob`), all live in its chunk loop: the chunk's recomputed
    fp32 logits and their gradient dz in the weight's dtype; dL/dhidden in fp32 over the micro-batch's tokens;
    dL/dweight in fp32 over the shard (allocated even for a frozen head) and, for a trained head, the bf16
    product dz^T h added into it.

    >>> s = Shape(layers=1, hidden=8, ffn=16, heads=2, groups=1, head_dim=4, vocab=256)
    >>> logprob_backward_bytes(s, 10, 1, "bf16")  # 10 x 256 x (4 + 2) + 10 x 8 x 4 + 256 x 8 x (4 + 2)
    27968
    """
    vocab, w = vocab_shard(shape, tp, divisible_by), WEIGHT_BYTES[dtype]
    chunk = min(tokens, LOGPROB_CHUNK)
    return chunk * vocab * (FP32 + w) + tokens * shape.hidden * FP32 + vocab * shape.hidden * (
        FP32 + (w if head_trained else 0))


def micro_batch_tokens(rows: int, length: int, micro_batch_size: int, max_tokens: int, pack: bool,
                       dynamic: bool) -> int:
    """Tokens of the largest micro-batch `trainer.schedule.split_micro_batches` cuts from `rows` rows of `length`
    (every row at the budget: the plan's worst case): packed, the balanced bins of `data.packing.plan_bins`;
    token-budget, as many whole rows as the budget takes; else `micro_batch_size` rows.

    >>> micro_batch_tokens(512, 384, 64, 65536, pack=True, dynamic=False)  # 4 bins of 128 rows
    49152
    >>> micro_batch_tokens(512, 384, 64, 65536, pack=False, dynamic=True)  # 170 rows
    65280
    >>> micro_batch_tokens(512, 384, 64, 0, pack=False, dynamic=False)
    24576
    """
    from rlhf_mcore.data.packing import plan_bins, token_budget

    if not (pack or dynamic):
        return min(rows, micro_batch_size) * length
    budget = token_budget([length], micro_batch_size, max_tokens)
    if pack:
        return max(len(b) for b in plan_bins([length] * rows, budget)) * length
    return max(1, min(rows, budget // length)) * length


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the dynamic terms depend on, from a config at a DP size."""

    rows: int  # rows one rank decodes at once
    length: int  # prompt + response budget
    update_tokens: int  # tokens of one update micro-batch
    forward_tokens: int  # tokens of one forward-only micro-batch (old / ref log-probs, values)
    prompt: int = 0  # the prompt budget (the rollout's prefill)
    critic_tokens: int = 0  # tokens of one critic update micro-batch

    @classmethod
    def of(cls, cfg, dp: int) -> "Batch":
        length = cfg.data.max_prompt_length + cfg.rollout.max_response_length
        train_rows = -(-cfg.data.train_batch_size * cfg.rollout.n // dp)
        rows = min(train_rows, cfg.rollout.micro_batch_size) if cfg.rollout.micro_batch_size else train_rows
        pack = cfg.data.use_sequence_packing

        def tokens(section, mini: int, forward_only: bool = False) -> int:  # as trainer.phases.micro_batching
            budget = section.max_tokens_per_gpu if section.use_dynamic_bsz else a.max_tokens_per_gpu if pack else 0
            if forward_only and (section.use_dynamic_bsz or pack) and a.log_prob_max_tokens_per_gpu > 0:
                budget = a.log_prob_max_tokens_per_gpu
            mini_rows = -(-mini * cfg.rollout.n // dp)
            return micro_batch_tokens(min(train_rows, mini_rows), length, section.micro_batch_size_per_gpu,
                                      budget, pack, section.use_dynamic_bsz)
        a, c = cfg.actor, cfg.critic
        return cls(rows=rows, length=length, update_tokens=tokens(a, a.ppo_mini_batch_size),
                   forward_tokens=tokens(a, cfg.data.train_batch_size, forward_only=True),
                   prompt=cfg.data.max_prompt_length, critic_tokens=tokens(c, c.ppo_mini_batch_size))
