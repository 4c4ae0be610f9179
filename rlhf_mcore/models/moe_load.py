"""The MoE load-balance metrics of one actor update (`moe/*`), reduced over every rank.

Counts come from `routing.RoutingHooks.counts` [num_layers, E]: the valid tokens (no padding) that picked
each expert among their top-k, summed over the update's micro-batches (every mini-batch and epoch). Each rank
holds its own tokens for its stage's layers (zeros for the others); DP and EP ranks hold different tokens and
TP ranks the same ones, so the global count is the sum over all ranks / tp. The router losses come from
megatron's layer-wise tracker (`moe_utils.save_to_aux_losses_tracker`, fed by every training forward while
`model.moe_aux_loss_coeff` / `moe_z_loss_coeff` > 0): per layer, summed over this rank's micro-batches;
megatron's reduce group first (the aux loss's tp-cp partial sums), then a micro-batch mean over all ranks.

  moe/tokens_per_expert/e<j>              tokens routed to expert j, summed over layers
  moe/expert_load_max_over_mean           max_j / mean_j of a layer's counts, averaged over layers (1 = balanced)
  moe/expert_load_max_over_mean_max       the same, worst layer
  moe/aux_loss, moe/z_loss                the router losses (without their coefficients), mean over layers
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

TRACKED = {"load_balancing_loss": "moe/aux_loss", "seq_load_balancing_loss": "moe/seq_aux_loss",
           "global_load_balancing_loss": "moe/global_aux_loss", "z_loss": "moe/z_loss"}


def load_balance_metrics(counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Global counts [L, E] -> the metrics above (0-dim tensors; layers that routed nothing are left out).

    >>> m = load_balance_metrics(torch.tensor([[2.0, 2.0, 2.0, 2.0], [5.0, 1.0, 1.0, 1.0]]))
    >>> {k: round(float(v), 3) for k, v in m.items() if not k.startswith("moe/tokens")}
    {'moe/expert_load_max_over_mean': 1.75, 'moe/expert_load_max_over_mean_max': 2.5}
    >>> float(m["moe/tokens_per_expert/e0"])
    7.0
    """
    counts = counts.double()
    used = counts.sum(-1) > 0
    ratio = counts[used].max(-1).values / counts[used].mean(-1)  # [layers that routed tokens]
    zero = torch.zeros((), dtype=counts.dtype, device=counts.device)
    out = {f"moe/tokens_per_expert/e{j}": c for j, c in enumerate(counts.sum(0))}
    out["moe/expert_load_max_over_mean"] = ratio.mean() if ratio.numel() else zero
    out["moe/expert_load_max_over_mean_max"] = ratio.max() if ratio.numel() else zero
    return out


def global_counts(counts: torch.Tensor, tp_size: int) -> torch.Tensor:
    """This rank's counts [L, E] -> the global ones (sum over all ranks; TP ranks count the same tokens)."""
    total = counts.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return total / tp_size


def clear_router_losses() -> None:
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

    clear_aux_losses_tracker()


def router_loss_metrics(num_forwards: int, pp_size: int) -> dict[str, torch.Tensor]:
    """{moe/aux_loss, moe/z_loss, ...} of the losses megatron tracked since `clear_router_losses` (none when
    disabled); `num_forwards`: this rank's training forwards in that time (its micro-batches)."""
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    out = {}
    for name, entry in sorted(get_moe_layer_wise_logging_tracker().items()):
        values = entry["values"].detach().float().clone()  # [L] summed over this rank's micro-batches
        if name not in TRACKED:
            continue
        if entry.get("reduce_group") is not None and not entry.get("reduce_group_has_dp"):
            dist.all_reduce(values, group=entry["reduce_group"])
        packed = torch.cat([values, torch.tensor([float(num_forwards)], device=values.device)])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(packed)
        per_layer = packed[:-1] / (packed[-1] / pp_size).clamp(min=1.0)  # every stage counted its micro-batches
        out[TRACKED[name]] = per_layer.mean()
    return out


@contextmanager
def moe_update_metrics(hooks, reports: list):
    """Around a role's update with `hooks` (`routing.RoutingHooks`, None for a dense model: nothing happens):
    clears megatron's router-loss tracker first; afterwards closes the hooks and appends the update's global
    `moe/*` metrics to `reports` as one bare entry (already reduced over all ranks, as grad_norm is)."""
    if hooks is None:
        yield
        return
    clear_router_losses()
    with hooks:
        yield
    router = next(r for rs in hooks.routers.values() for r in rs)
    metrics = load_balance_metrics(global_counts(hooks.counts, router.tp_group.size()))
    metrics.update(router_loss_metrics(hooks.forwards, router.config.pipeline_model_parallel_size))
    reports.append(metrics)
