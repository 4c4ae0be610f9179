"""Critic (value) loss with value clipping (`critic.cliprange_value`)."""
from __future__ import annotations

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import masked_mean


def compute_value_loss(
    values: Tensor,  # [B, T] current critic predictions V_phi(s_t), differentiable
    returns: Tensor,  # [B, T] regression targets R_t (e.g. GAE returns)
    old_values: Tensor,  # [B, T] critic predictions at rollout time
    response_mask: Tensor,  # [B, T]
    cliprange_value: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss of PPO2 (OpenAI baselines ppo2, as in PPO arXiv 1707.06347's implementation):
    0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) per token; `cliprange_value=None` gives the
    plain 0.5 * (V - R)^2. Returns (per_token_loss [B, T], 0 at padding; metrics) with metrics vf_clipfrac
    (fraction of valid tokens where the clipped term is larger) and vpred_mean. Reduce the loss with
    `aggregate_loss`. No gradient flows into returns or old_values.
    """
    returns, old_values = returns.detach(), old_values.detach()
    unclipped = (values - returns) ** 2
    if cliprange_value is None:
        loss, clipped_wins = 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        # clamp V itself into [V_old - c, V_old + c]: V_old + clamp(V - V_old) rounds an unclipped V, which
        # then counts as clipped in vf_clipfrac. Same as verl's clip_by_value.
        v_clipped = torch.maximum(torch.minimum(values, old_values + cliprange_value), old_values - cliprange_value)
        clipped = (v_clipped - returns) ** 2
        loss, clipped_wins = 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped
    mask = response_mask
    loss = torch.where(mask.bool(), loss, torch.zeros_like(loss))
    metrics = {
        "vf_clipfrac": masked_mean(clipped_wins.to(values.dtype), mask).detach(),
        "vpred_mean": masked_mean(values.detach(), mask),
    }
    return loss, metrics
