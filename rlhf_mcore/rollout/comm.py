"""Communication of the native engine: vocab-parallel logits (TP) and stage-to-stage hand-offs (PP).

Every function takes the `ParallelContext`; groups come from `ctx.pgs` (never from megatron's globals).
All of them are collective over their group: every rank of the group calls them in the same order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from rlhf_mcore.models.logprobs import gather_vocab_logits
from rlhf_mcore.rollout.sampling import mask_padded_vocab


def full_vocab_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: int, ctx) -> torch.Tensor:
    """hidden [B, h] @ the local vocab shard weight [V_padded/tp, h] -> all-gathered logits [B, V_padded]
    in fp32, ids >= vocab_size (vocab padding) set to -inf. Identical on every TP rank."""
    return mask_padded_vocab(gather_vocab_logits(hidden, weight, ctx.pgs.tp), vocab_size)


def _stage_rank(ctx, stage: int) -> int:
    """Global rank of pipeline stage `stage` within this rank's pipeline."""
    return dist.get_process_group_ranks(ctx.pgs.pp)[stage]


def send_to_next_stage(hidden: torch.Tensor, ctx) -> None:
    """Hidden states [s, b, h] to the next pipeline stage (blocking)."""
    dist.send(hidden.contiguous(), dst=_stage_rank(ctx, ctx.pp_rank + 1), group=ctx.pgs.pp)


def recv_from_prev_stage(shape: tuple[int, ...], dtype: torch.dtype, ctx) -> torch.Tensor:
    """Hidden states [s, b, h] from the previous pipeline stage (blocking)."""
    buffer = torch.empty(shape, dtype=dtype, device=ctx.device)
    dist.recv(buffer, src=_stage_rank(ctx, ctx.pp_rank - 1), group=ctx.pgs.pp)
    return buffer


def broadcast_from_last_stage(payload: torch.Tensor, ctx) -> torch.Tensor:
    """The last stage's `payload` on every stage of the pipeline (others pass a same-shape buffer)."""
    if ctx.dims.pp == 1:
        return payload
    payload = payload.contiguous()
    dist.broadcast(payload, src=_stage_rank(ctx, ctx.dims.pp - 1), group=ctx.pgs.pp)
    return payload


def pack_step(tokens: torch.Tensor, logprobs: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
    """One decode step's results as a single [3, B] fp64 tensor (one broadcast; ids < 2**53 stay exact).

    >>> t, lp, f = unpack_step(pack_step(torch.tensor([7, 9]), torch.tensor([-0.5, -1.5]),
    ...                                  torch.tensor([True, False])))
    >>> t.tolist(), lp.tolist(), f.tolist()
    ([7, 9], [-0.5, -1.5], [True, False])
    """
    return torch.stack([tokens.double(), logprobs.double(), finished.double()])


def unpack_step(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[3, B] fp64 -> (tokens [B] long, logprobs [B] fp32, finished [B] bool)."""
    return packed[0].long(), packed[1].float(), packed[2] > 0.5
