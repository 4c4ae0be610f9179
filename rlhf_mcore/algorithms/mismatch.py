"""Rollout/trainer mismatch correction: importance weights between the rollout engine and the trainer.

The rollout engine (sglang/vLLM, other kernels, other precision) samples from pi_rollout, while the loss
assumes samples from the trainer's pi_old. The correction multiplies the policy loss (`PolicyLossInputs.
is_weights`) by w = pi_old / pi_rollout, bounded:
  truncate  w -> clip(w, threshold_low, threshold)          truncated IS, TIS (Yao et al. 2025, "Your
            Efficient RL Framework Secretly Brings You Off-Policy RL Training"): w_t = min(w_t, C)
  mask      w -> w if threshold_low <= w <= threshold else 0   masked IS, MIS (Liu et al. 2025, "When Speed
            Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch")
at the token level (w_t per token) or the sequence level (w = prod_t w_t, one weight per response).
"""
from __future__ import annotations

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import masked_max, masked_mean, masked_sum
from rlhf_mcore.registry import Registry

MISMATCH_LEVELS: Registry = Registry("mismatch correction level (actor.rollout_correction)")
MISMATCH_MODES: Registry = Registry("mismatch correction mode (actor.rollout_correction_mode)")

_EXACT_TOL = 1e-5  # fp32 log-softmax over a vocabulary in another order differs by ~1e-6
_MAX_LOG_WEIGHT = 20.0


@MISMATCH_LEVELS.register("token")
def _token_log_weights(log_w: Tensor, mask: Tensor) -> Tensor:
    """log w_t = log pi_old(y_t) - log pi_rollout(y_t). [B, T] -> [B, T]"""
    return log_w


@MISMATCH_LEVELS.register("sequence")
def _sequence_log_weights(log_w: Tensor, mask: Tensor) -> Tensor:
    """log w = sum_t log w_t over valid tokens, broadcast to the sequence. [B, T] -> [B, T]"""
    return masked_sum(log_w, mask, -1)[:, None].expand_as(log_w)


@MISMATCH_MODES.register("truncate")
def _truncate(w: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    return w.clamp(low, high), (w > high) | (w < low)


@MISMATCH_MODES.register("mask")
def _mask(w: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    outside = (w > high) | (w < low)
    return torch.where(outside, torch.zeros_like(w), w), outside


def first_valid(mask: Tensor) -> Tensor:
    """[B, T] -> [B, T] bool, True at each row's first valid position (a row's first response token).

    >>> first_valid(torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])).int().tolist()
    [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    """
    valid = mask.bool()
    return valid & (valid.long().cumsum(dim=1) == 1)


# metrics that are a mean over other positions than the valid tokens: metric -> mask [B, T] -> those positions
# (the trainer weighs each metric by the count of its positions when it reduces them over micro-batches)
METRIC_POSITIONS = {"mismatch_first_abs_diff": first_valid}


@torch.no_grad()
def compute_mismatch_weights(
    old_logp: Tensor,  # [B, T] trainer log-probs of the sampled tokens (pi_old)
    rollout_logp: Tensor,  # [B, T] rollout engine log-probs of the same tokens (pi_rollout)
    response_mask: Tensor,  # [B, T]
    *,
    level: str = "token",
    mode: str = "truncate",
    threshold: float = 2.0,
    threshold_low: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bounded importance weights pi_old / pi_rollout (see the module docstring) and mismatch metrics.

    Returns (weights [B, T], 0 at padding, no grad; metrics, detached 0-dim over valid tokens):
      mismatch_logp_abs_diff  mean |log pi_old - log pi_rollout|
      mismatch_kl_k1          mean (log pi_rollout - log pi_old), k1 estimate of KL(pi_rollout || pi_old)
      mismatch_kl_k3          mean (w - 1 - log w), k3 estimate of the same KL
      mismatch_first_abs_diff mean |log pi_old - log pi_rollout| of each row's first response token (what the
                              engine's prefill computed; the rest came from its decode steps)
      mismatch_exact_frac     fraction of valid tokens whose two log-probs agree to 1e-5 (equal up to the fp32
                              summation order of the log-softmax; 1.0 = the engine computes what the trainer does)
      mismatch_{mode}_frac    (mismatch_truncate_frac / mismatch_mask_frac) fraction of valid tokens whose
                              weight was truncated / masked
      is_weight_mean, is_weight_max   of the returned weights
    """
    if not 0.0 <= threshold_low < threshold:
        raise ValueError(
            f"actor.rollout_correction_threshold: need 0 <= threshold_low < threshold "
            f"(got {threshold_low}, {threshold}). Typical: threshold=2.0, threshold_low=0."
        )
    mask = response_mask
    log_w_tok = (old_logp - rollout_logp).float()  # [B, T]
    log_w = MISMATCH_LEVELS.get(level)(log_w_tok, mask).clamp(-_MAX_LOG_WEIGHT, _MAX_LOG_WEIGHT)
    weights, affected = MISMATCH_MODES.get(mode)(torch.exp(log_w), threshold_low, threshold)
    weights = torch.where(mask.bool(), weights, torch.zeros_like(weights))
    log_w_safe = log_w_tok.clamp(-_MAX_LOG_WEIGHT, _MAX_LOG_WEIGHT)
    metrics = {
        "mismatch_logp_abs_diff": masked_mean(log_w_tok.abs(), mask),
        "mismatch_kl_k1": masked_mean(-log_w_tok, mask),
        "mismatch_kl_k3": masked_mean(torch.expm1(log_w_safe) - log_w_safe, mask),
        "mismatch_first_abs_diff": masked_mean(log_w_tok.abs(), first_valid(mask)),
        "mismatch_exact_frac": masked_mean((log_w_tok.abs() <= _EXACT_TOL).float(), mask),
        f"mismatch_{mode}_frac": masked_mean(affected.float(), mask),
        "is_weight_mean": masked_mean(weights, mask),
        "is_weight_max": masked_max(weights, mask),
    }
    return weights.to(old_logp.dtype), metrics
