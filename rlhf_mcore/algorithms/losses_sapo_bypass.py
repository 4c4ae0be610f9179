"""Two more policy losses, registered in POLICY_LOSSES like the rest: `sapo` (a soft gate instead of a
hard clip) and `bypass_mode` (the rollout engine's log-probs are the old policy). Same contract as
`losses.py`: `fn(PolicyLossInputs) -> (per_token_loss [B, T], metrics)`, verl's values and gradients.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from rlhf_mcore.algorithms.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    _finish,
    _log_ratio,
    _metrics,
    compute_vanilla_loss,
)
from rlhf_mcore.algorithms.mismatch import MISMATCH_LEVELS

_MAX_LOG_WEIGHT = 20.0


@POLICY_LOSSES.register("sapo")
def compute_sapo_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO, Soft Adaptive Policy Optimization (arXiv 2511.20347):
        J = E[ 1/G sum_i 1/|y_i| sum_t f_{i,t}(r_{i,t}) A_{i,t} ],
        f_{i,t}(x) = sigmoid(tau_{i,t} (x - 1)) * 4 / tau_{i,t},
    r = pi / pi_old (log-ratio clamped to +-20), tau = tau_pos where A > 0 else tau_neg. The gate's slope is 1 at
    r = 1 (the plain policy gradient on-policy) and decays smoothly off-policy instead of a hard clip.
    Aggregated with seq-mean-token-mean (the 1/G 1/|y_i| above; see `losses.agg_mode_for`).
    pg_clipfrac and pg_clipfrac_lower are 0 (nothing is clipped), as in verl.
    """
    adv = inp.advantages.detach()
    log_ratio = _log_ratio(inp)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, inp.tau_pos), torch.full_like(adv, inp.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return _finish(-gate * adv, inp, _metrics(ratio, inp, log_ratio=log_ratio))


def _bypass_weights(inp: PolicyLossInputs, rollout_logp: Tensor) -> Tensor | None:
    """Truncated IS weights pi_theta / pi_rollout at `bypass_is_level` (token | sequence), no grad. [B, T]"""
    if inp.bypass_is_level is None:
        return None
    log_w = MISMATCH_LEVELS.get(inp.bypass_is_level)(inp.logp.detach() - rollout_logp, inp.response_mask)
    weights = torch.exp(log_w.clamp(-_MAX_LOG_WEIGHT, _MAX_LOG_WEIGHT)).clamp(max=inp.bypass_is_threshold)
    return torch.where(inp.response_mask.bool(), weights, torch.zeros_like(weights))


def _bypass_ppo_clip(inp: PolicyLossInputs, rollout_logp: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    return compute_vanilla_loss(dataclasses.replace(inp, old_logp=rollout_logp, is_weights=None))


def _bypass_reinforce(inp: PolicyLossInputs, rollout_logp: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    weights = _bypass_weights(inp, rollout_logp)
    loss = -inp.advantages.detach() * inp.logp
    if weights is not None:
        loss = loss * weights
    log_ratio = inp.logp - rollout_logp
    metrics = _metrics(torch.exp(log_ratio.clamp(-_MAX_LOG_WEIGHT, _MAX_LOG_WEIGHT)), inp, log_ratio=log_ratio)
    return _finish(loss, inp, metrics, apply_is_weights=False)


BYPASS_LOSS_TYPES = {"ppo_clip": _bypass_ppo_clip, "reinforce": _bypass_reinforce}


@POLICY_LOSSES.register("bypass_mode")
def compute_bypass_mode_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Bypass mode (verl): the rollout engine's log-probs `rollout_logp` ARE the old policy, so the off-policy
    correction happens inside the loss instead of through a separate IS weight. `bypass_loss_type`:
      ppo_clip   PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347, Eq. 7, with dual clip) with
                 r = pi_theta / pi_rollout; no extra IS weight (the ratio already is one).
      reinforce  -w * A * log pi_theta(y_t) with the truncated IS weight w = min(pi_theta / pi_rollout, C)
                 (TIS, Yao et al. 2025), at `bypass_is_level` token / sequence (None: w = 1, plain REINFORCE,
                 Williams 1992). ppo_kl = mean(log pi_rollout - log pi_theta).
    `is_weights` of the batch are ignored. Needs `rollout_logp`.
    """
    if inp.rollout_logp is None:
        raise ValueError("actor.policy_loss=bypass_mode: needs the rollout log-probs (got None). "
                         "Use a rollout engine that returns log-probs of the sampled tokens.")
    if inp.bypass_loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"actor.bypass_loss_type: must be one of {', '.join(BYPASS_LOSS_TYPES)} "
                         f"(got {inp.bypass_loss_type!r}). Pick one of those.")
    return BYPASS_LOSS_TYPES[inp.bypass_loss_type](inp, inp.rollout_logp.detach())
