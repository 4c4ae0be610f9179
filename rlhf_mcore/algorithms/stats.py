"""Masked and grouped statistics shared by the algorithm library.

Pure tensor functions: no `.item()`, no process groups. Masks may be bool, int or float;
a position counts as valid where the mask is non-zero. Padded positions never leak into a result,
even when they hold `inf`/`nan`, because values are selected with `torch.where`, not multiplied.
"""
from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over valid positions (all of them, or along `dim`)."""
    kept = torch.where(mask.bool(), x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid positions, as an integer tensor."""
    valid = mask.bool()
    return valid.sum() if dim is None else valid.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over valid positions; 0 where there is none."""
    count = masked_count(mask, dim).clamp(min=1).to(x.dtype)
    return masked_sum(x, mask, dim) / count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all valid positions (Bessel-corrected when `unbiased`); 0-dim."""
    mean = masked_mean(x, mask)
    count = masked_count(mask).to(x.dtype)
    denom = (count - 1.0 if unbiased else count).clamp(min=1.0)
    return masked_sum((x - mean) ** 2, mask) / denom


def masked_whiten(x: Tensor, mask: Tensor, var_epsilon: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + var_epsilon) over valid positions, 0 at padding; var is unbiased.
    verl's `masked_whiten` (rsqrt of var + 1e-8), not (x - mean) / (std + eps)."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + var_epsilon), torch.zeros_like(x))


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max over valid positions (-inf where none)."""
    return torch.where(mask.bool(), x, torch.full_like(x, float("-inf"))).max()


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Min over valid positions (+inf where none)."""
    return torch.where(mask.bool(), x, torch.full_like(x, float("inf"))).min()


def group_inverse(group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Compact arbitrary group ids to 0..G-1.

    Returns (inverse [B] long, counts [G] long). Groups may have different sizes and ids need not be
    contiguous or sorted.
    """
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return inverse, counts


def group_sum(x: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """Per-group sums: [B] -> [G]."""
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)


def group_mean_std(scores: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Group mean, unbiased group std and group size, each gathered back to the samples.

    scores [B], group_index [B] -> (mean [B], std [B], size [B] long). Std of a singleton group is 0.
    """
    inverse, counts = group_inverse(group_index)
    num_groups = counts.shape[0]
    n = counts.to(scores.dtype)
    mean_g = group_sum(scores, inverse, num_groups) / n  # [G]
    sq_dev = (scores - mean_g[inverse]) ** 2  # [B]
    var_g = group_sum(sq_dev, inverse, num_groups) / (n - 1.0).clamp(min=1.0)  # [G]
    return mean_g[inverse], var_g.sqrt()[inverse], counts[inverse]


def sequence_scores(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Outcome score of each response: the sum of its token rewards over valid tokens. [B, T] -> [B]."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)
