"""Expert parallelism in megatron's schedule: every MoE forward (and backward) exchanges tokens over the
expert-parallel group, so the group's ranks must run the same number of micro-batches. Token-budget and packed
micro-batches (actor.use_dynamic_bsz, data.use_sequence_packing) give each rank its own count; `pad_to_group`
appends copies of a rank's last micro-batch up to the group's maximum. A copy runs forward and backward like any
micro-batch (its experts' all-to-alls meet the other ranks'), but its loss and token count are multiplied by 0
(`padding_loss`: no gradient, no change to the per-token normalisation), routing hooks skip it, and run_schedule
drops its outputs, so metrics and collected log-probs see the real micro-batches only. Dense models and EP 1:
nothing changes, no collective.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class PaddingBatch(dict):
    """A micro-batch run only to keep the expert-parallel group in step (a copy of a real one)."""


def expert_group(models: list):
    """The expert-parallel process group of the models' MoE layers, or None (dense, or EP 1)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for chunk in models:
        for module in chunk.modules():
            if isinstance(module, MoELayer):
                group = module.ep_group
                return group if group is not None and group.size() > 1 else None
    return None


def pad_to_group(models: list, micro_batches: list[dict]) -> tuple[list[dict], int]:
    """(micro-batches padded to the expert group's largest count, the number of real ones)."""
    group = expert_group(models)
    real = len(micro_batches)
    if group is None:
        return micro_batches, real
    count = torch.tensor([real], dtype=torch.long, device=micro_batches[0]["tokens"].device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return micro_batches + [PaddingBatch(micro_batches[-1]) for _ in range(int(count.item()) - real)], real


def padding_loss(loss_fn, mb, output, non_loss_data: bool = False):
    """loss_fn on a padding micro-batch: (0 x loss_sum, 0 x count, metrics) for training, as is forward-only."""
    out = loss_fn(mb, output, non_loss_data)
    if non_loss_data:
        return out
    loss_sum, count, metrics = out
    return loss_sum * 0, count * 0, metrics
