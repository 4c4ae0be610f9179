"""Per-token log-probs and entropy of given tokens from the actor's final hidden states.

The output weight stays vocab-parallel: `kernels.fused_logprob` reduces max / sum-exp / target logit
across TP ranks chunk by chunk, so full-vocab logits of the whole batch never exist. Padded vocab rows
(added for TP divisibility) are sliced off before the reduction, so they never leak into outputs.
Outputs are aligned with the tokens: out[:, t] = log p(tokens[:, t] | tokens[:, :t]), out[:, 0] = 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_mcore.kernels.fused_logprob import fused_logprob_entropy
from rlhf_mcore.kernels.logits import logits_fp32
from rlhf_mcore.models.heads import lm_output_weight


def real_vocab_shard(weight: torch.Tensor, vocab_size: int, tp_rank: int) -> tuple[torch.Tensor, int]:
    """(rows of this rank's shard that are real vocab entries, global id of its first row)."""
    rows = weight.size(0)
    start = tp_rank * rows
    keep = max(0, min(rows, vocab_size - start))
    return weight[:keep], start


def token_logprobs(model, hidden: torch.Tensor, tokens: torch.Tensor, tp_group, temperature: float = 1.0,
                   chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [b, s, h], tokens [b, s] -> (logp [b, s], entropy [b, s]), differentiable."""
    weight, start = real_vocab_shard(lm_output_weight(model), model.vocab_size_unpadded, tp_group.rank())
    b, s, h = hidden.shape
    logp, entropy = fused_logprob_entropy(
        hidden[:, :-1].reshape(-1, h), weight, tokens[:, 1:].reshape(-1),
        tp_group=tp_group if tp_group.size() > 1 else None, vocab_start=start,
        temperature=temperature, chunk_size=chunk_size,
    )
    pad = (1, 0)  # position 0 has no prediction
    return F.pad(logp.view(b, s - 1), pad), F.pad(entropy.view(b, s - 1), pad)


def gather_vocab_logits(hidden: torch.Tensor, weight: torch.Tensor, tp_group) -> torch.Tensor:
    """hidden [..., h] @ this rank's vocab shard weight [V_padded / tp, h] -> logits [..., V_padded] gathered
    over TP in rank order, in fp32 never rounded to bf16 (`logits_fp32`, the trainer's logits; the one TP
    gather of full-vocab logits; no autograd)."""
    local = logits_fp32(hidden, weight)
    if tp_group.size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(tp_group.size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=tp_group)
    return torch.cat(parts, dim=-1)


def full_logits(model, hidden: torch.Tensor, tp_group) -> torch.Tensor:
    """hidden [..., h] -> logits [..., vocab_size] gathered over TP (for tests, tools and small decode batches)."""
    return gather_vocab_logits(hidden, lm_output_weight(model), tp_group)[..., : model.vocab_size_unpadded]


@torch.no_grad()
def token_sum_pi_squared(model, hidden: torch.Tensor, tokens: torch.Tensor, tp_group, temperature: float = 1.0,
                         chunk_size: int = 4096) -> torch.Tensor:
    """hidden [b, s, h] -> sum_v pi(v | tokens[:, :t])^2 [b, s] (0 at t = 0), forward only, aligned like
    `token_logprobs`. Vocab-parallel like the fused kernel: per row chunk, the local max, sum exp(z - m) and
    sum exp(2 (z - m)) are combined over TP ranks, so full-vocab logits never exist. For the optimal token
    baseline (rlhf_mcore.algorithms.advantages_otb)."""
    weight, _ = real_vocab_shard(lm_output_weight(model), model.vocab_size_unpadded, tp_group.rank())
    b, s, h = hidden.shape
    flat = hidden[:, :-1].reshape(-1, h)
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    parts = []
    for start in range(0, flat.size(0), chunk_size):
        z = logits_fp32(flat[start:start + chunk_size], weight) * inv_t  # [n, V_local] fp32
        local_max = z.max(-1).values
        global_max = local_max.clone()
        if tp_group.size() > 1:
            torch.distributed.all_reduce(global_max, op=torch.distributed.ReduceOp.MAX, group=tp_group)
        e = torch.exp(z - global_max[:, None])
        sums = torch.stack([e.sum(-1), e.square().sum(-1)])  # [2, n]
        if tp_group.size() > 1:
            torch.distributed.all_reduce(sums, group=tp_group)
        parts.append(sums[1] / sums[0].square())
    return F.pad(torch.cat(parts).view(b, s - 1), (1, 0))
