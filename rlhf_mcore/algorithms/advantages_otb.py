"""Optimal Token Baseline (OTB) estimators: a per-token baseline from the group's rewards-to-go, weighted
by the accumulated squared norm of the score function (verl `optimal_token_baseline`,
`tir_optimal_token_baseline`).

The optimal constant baseline of a policy-gradient estimator minimises its variance:
    b* = E[||grad log pi(tau)||^2 R] / E[||grad log pi(tau)||^2]
(Greensmith, Bartlett & Baxter 2004, JMLR 5, "Variance Reduction Techniques for Gradient Estimates in RL",
Thm. 8; Weaver & Tao 2001). OTB (R. Li 2025, https://richardli.xyz/optimal-token-baseline) applies it per
token t with the logit-gradient proxy ||d log pi(y_j) / d logits_j||^2 = 1 - 2 pi_j + sum_v pi_v^2:
    W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_{j,v}^2) [* rho_j^2 with rollout IS weights rho],
    B_t = sum_i G_t^i W_t^i / (sum_i W_t^i + 1e-8),   A_t^i = G_t^i - B_t,
over the responses i of one prompt (G_t = undiscounted reward-to-go). A group of one gets B = 0.
"""
from __future__ import annotations

import torch
from torch import Tensor

from rlhf_mcore.algorithms.advantages import ADVANTAGES, AdvantageInputs, discounted_returns
from rlhf_mcore.algorithms.stats import group_inverse, group_sum

_EPS = 1e-8  # verl's default epsilon of the OTB denominator


def path_variance(inp: AdvantageInputs, name: str) -> Tensor:
    """W_t: cumulative 1 - 2 pi_t + sum pi^2 over valid tokens (times rho^2 with IS weights). [B, T]"""
    mask = inp.response_mask
    pi = inp.require("old_logp", name).exp()
    w = 1.0 - 2.0 * pi + inp.require("sum_pi_squared", name)
    if inp.is_weights is not None:
        w = w * inp.is_weights.square()
    return torch.where(mask.bool(), w, torch.zeros_like(w)).cumsum(-1)


def group_baseline(returns: Tensor, weight: Tensor, valid: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """B[g, t] = sum_i G W / (sum_i W + eps) over the valid rows of each group, gathered to rows. [B, T]"""
    zero = torch.zeros_like(returns)
    num = torch.zeros((num_groups, returns.shape[1]), dtype=returns.dtype, device=returns.device)
    den = torch.zeros_like(num)
    num.index_add_(0, inverse, torch.where(valid, returns * weight, zero))
    den.index_add_(0, inverse, torch.where(valid, weight, zero))
    return (num / (den + _EPS))[inverse]


def zero_tail(baseline: Tensor, lengths: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """The one strictly longest response of a group gets baseline 0 from the second-longest length on."""
    neg = torch.full((num_groups,), -1, dtype=lengths.dtype, device=lengths.device)
    longest = neg.scatter_reduce(0, inverse, lengths, "amax")  # [G]
    is_longest = lengths == longest[inverse]
    num_longest = group_sum(is_longest.long(), inverse, num_groups)  # [G]
    second = neg.scatter_reduce(0, inverse, torch.where(is_longest, -1, lengths), "amax")  # [G]
    row_tail = is_longest & (num_longest[inverse] == 1) & (second[inverse] >= 0)  # [B]
    positions = torch.arange(baseline.shape[1], device=baseline.device)
    tail = row_tail[:, None] & (positions[None, :] >= second[inverse][:, None])
    return torch.where(tail, torch.zeros_like(baseline), baseline)


def _otb(returns: Tensor, weight: Tensor, valid: Tensor, group_index: Tensor, handle_zero_tail: bool) -> Tensor:
    """A = (G - B) on valid positions of position-aligned [B, T] rows, 0 elsewhere."""
    inverse, counts = group_inverse(group_index)
    num_groups = counts.shape[0]
    baseline = group_baseline(returns, weight, valid, inverse, num_groups)
    baseline = torch.where((counts[inverse] > 1)[:, None], baseline, torch.zeros_like(baseline))
    if handle_zero_tail:
        baseline = zero_tail(baseline, valid.sum(-1), inverse, num_groups)
    return torch.where(valid, returns - baseline, torch.zeros_like(returns))


@ADVANTAGES.register("optimal_token_baseline", groups=True, sum_pi_squared=True)
@torch.no_grad()
def compute_optimal_token_baseline(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """OTB (see the module docstring) with B_t aligned by position t in the response. returns = G.
    Needs `group_index`, `old_logp` and `sum_pi_squared`; `is_weights` optional. No zero tail (verl default).
    """
    name = "optimal_token_baseline"
    mask = inp.response_mask
    returns = discounted_returns(inp.token_level_rewards, mask, 1.0)
    adv = _otb(returns, path_variance(inp, name), mask.bool(), inp.require("group_index", name), False)
    return adv, returns


def _compact(x: Tensor, valid: Tensor, rank: Tensor) -> Tensor:
    """Move each row's valid entries to the front (in order), zeros after. [B, T] -> [B, T]"""
    width = x.shape[1]
    out = torch.zeros((x.shape[0], width + 1), dtype=x.dtype, device=x.device)
    out.scatter_(1, torch.where(valid, rank, width), torch.where(valid, x, torch.zeros_like(x)))
    return out[:, :width]


@ADVANTAGES.register("tir_optimal_token_baseline", groups=True, sum_pi_squared=True)
@torch.no_grad()
def compute_tir_optimal_token_baseline(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Multi-turn (tool-integrated) OTB: as `optimal_token_baseline`, but B is aligned by the index of the
    VALID token (tool outputs and other mask-0 tokens removed first), responses without a valid token
    leave their group, and the strictly longest response of a group gets B = 0 beyond the second-longest
    length (verl `handle_zero_tail=True`). returns = G. Same inputs as `optimal_token_baseline`.
    """
    name = "tir_optimal_token_baseline"
    mask = inp.response_mask
    valid = mask.bool()
    rank = valid.long().cumsum(-1) - 1  # [B, T] index among the row's valid tokens
    lengths = valid.sum(-1)
    returns = discounted_returns(inp.token_level_rewards, mask, 1.0)
    compact_valid = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
    group_index = inp.require("group_index", name)
    group_index = torch.where(lengths > 0, group_index, group_index.min() - 1 - torch.arange(
        len(lengths), device=lengths.device))  # an empty row is a group of its own
    compact_adv = _otb(_compact(returns, valid, rank), _compact(path_variance(inp, name), valid, rank),
                       compact_valid, group_index, True)
    adv = compact_adv.gather(1, rank.clamp(min=0))
    return torch.where(valid, adv, torch.zeros_like(adv)), returns
