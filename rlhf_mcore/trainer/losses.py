"""Loss functions of the trainable roles, in megatron's schedule contract.

Each is called on the last pipeline stage as loss_fn(micro_batch, output, non_loss_data=False):
training returns (loss_sum, count, metrics) for megatron's per-token path, each metric paired with its
weight, the valid tokens (or rows) it is a mean over (`metrics.weighted`: reduced like the loss); forward-only
(non_loss_data=True) returns per-token tensors aligned with the tokens. The maths is the registered
pure functions of `rlhf_mcore.algorithms`; this module only wires micro-batch fields to them. Packed
micro-batches compute log-probs / values on the packed tokens, then go back to the row layout (`to_rows`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_mcore.algorithms.aggregate import aggregate_loss
from rlhf_mcore.algorithms.kl import kl_penalty
from rlhf_mcore.algorithms.losses import POLICY_LOSSES, PolicyLossInputs, agg_mode_for, compute_entropy_bonus
from rlhf_mcore.algorithms.mismatch import METRIC_POSITIONS, compute_mismatch_weights
from rlhf_mcore.algorithms.stats import masked_count, masked_mean
from rlhf_mcore.algorithms.value import compute_value_loss
from rlhf_mcore.data.packing import is_packed, to_rows
from rlhf_mcore.models.logprobs import token_logprobs, token_sum_pi_squared
from rlhf_mcore.trainer.metrics import weighted


def rollout_mismatch(old_logp, rollout_logp, mask, actor_cfg):
    """(importance weights pi_old / pi_rollout, or None when actor.rollout_correction=none;
    rollout/mismatch_* metrics, each (value, weight): the count of the positions it is a mean over,
    `mismatch.METRIC_POSITIONS`, else the valid tokens). old_logp / rollout_logp / mask [B, T]."""
    level = actor_cfg.rollout_correction
    weights, metrics = compute_mismatch_weights(
        old_logp, rollout_logp, mask, level=level if level != "none" else "token",
        mode=actor_cfg.rollout_correction_mode, threshold=actor_cfg.rollout_correction_threshold)
    tokens = masked_count(mask)
    counts = {k: masked_count(METRIC_POSITIONS[k](mask)) if k in METRIC_POSITIONS else tokens for k in metrics}
    return (None if level == "none" else weights), {f"rollout/{k}": (v, counts[k]) for k, v in metrics.items()}


def policy_loss_inputs(mb: dict, logp: torch.Tensor, old_logp: torch.Tensor, is_weights, actor_cfg) -> PolicyLossInputs:
    a = actor_cfg
    return PolicyLossInputs(
        logp=logp, old_logp=old_logp, advantages=mb["advantages"], response_mask=mb["response_mask"],
        clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high, clip_ratio_c=a.clip_ratio_c,
        is_weights=is_weights, tau_pos=a.tau_pos, tau_neg=a.tau_neg, rollout_logp=mb.get("rollout_logp"),
        bypass_loss_type=a.bypass_loss_type, bypass_is_threshold=a.rollout_correction_threshold,
        bypass_is_level=None if a.rollout_correction == "none" else a.rollout_correction,
        kl_cov_ratio=a.kl_cov_ratio, kl_cov_coef=a.kl_cov_coef,
    )


def actor_loss(mb, output, non_loss_data=False, *, model, tp_group, actor_cfg, temperature, norm_length,
               num_rows=None, with_sum_pi_squared=False, measure_mismatch=False):
    """output = final hidden states [b, s, h] ([1, T, h] packed: log-probs go back to rows first).
    num_rows: global rows of the mini-batch (seq-mean-token-sum-norm).
    Forward-only with `with_sum_pi_squared` also returns sum_v pi(v)^2 per token (optimal token baseline).
    Without mb["old_logp"] the step is on-policy (one epoch, one mini-batch): this forward's own log-probs,
    detached, are pi_old, and the rollout mismatch and its correction are computed here per micro-batch
    (`phases.is_on_policy`). `measure_mismatch`: this forward runs at the rollout's weights while mb["old_logp"]
    is the rollout's (`phases.old_from_rollout`): report the rollout mismatch of this forward's log-probs."""
    logp, entropy = token_logprobs(model, output, mb["tokens"], tp_group, temperature)  # [b, s]
    if is_packed(mb):
        logp, entropy = to_rows(logp, mb), to_rows(entropy, mb)
    if non_loss_data:
        out = {"logp": logp.detach(), "entropy": entropy.detach()}
        if with_sum_pi_squared:
            sum_pi_squared = token_sum_pi_squared(model, output, mb["tokens"], tp_group, temperature)
            out["sum_pi_squared"] = to_rows(sum_pi_squared, mb) if is_packed(mb) else sum_pi_squared
        return out
    mask = mb["response_mask"]
    is_weights, mismatch = mb.get("is_weights"), {}
    old_logp = mb.get("old_logp")
    if old_logp is None:
        old_logp = logp.detach()
        is_weights, mismatch = rollout_mismatch(old_logp, mb["rollout_logp"], mask, actor_cfg)
    elif measure_mismatch:
        _, mismatch = rollout_mismatch(logp.detach(), mb["rollout_logp"], mask, actor_cfg)
    per_token, metrics = POLICY_LOSSES.get(actor_cfg.policy_loss)(
        policy_loss_inputs(mb, logp, old_logp, is_weights, actor_cfg))
    metrics = {f"actor/{k}": v for k, v in metrics.items()}  # token means over the valid tokens
    metrics["actor/pg_loss"] = masked_mean(per_token.detach(), mask)
    if actor_cfg.entropy_coeff:
        bonus, _ = compute_entropy_bonus(entropy, mask, actor_cfg.entropy_coeff)
        per_token = per_token + bonus
    if actor_cfg.use_kl_loss:
        kl = kl_penalty(logp, mb["ref_logp"], actor_cfg.kl_loss_type)
        per_token = per_token + actor_cfg.kl_loss_coef * kl
        metrics["actor/kl_loss"] = masked_mean(kl.detach(), mask)
    metrics["actor/entropy"] = masked_mean(entropy.detach(), mask)
    mode = agg_mode_for(actor_cfg.policy_loss, actor_cfg.loss_agg_mode, actor_cfg.honor_loss_agg_mode)
    loss_sum, count, _ = aggregate_loss(per_token, mask, mode, norm_length=norm_length, num_rows=num_rows,
                                        sum_norm_per_seq=actor_cfg.sum_norm_per_seq)
    return loss_sum, count, {**mismatch, **weighted(metrics, masked_count(mask)),
                             "actor/loss_sum": loss_sum.detach(), "actor/loss_count": count}


def shift_values(output: torch.Tensor) -> torch.Tensor:
    """Scalar head output [b, s, 1] -> [b, s] with out[:, t] = V(tokens[:, :t]) (the state before token t)."""
    return F.pad(output[..., 0][:, :-1].float(), (1, 0))


def critic_loss(mb, output, non_loss_data=False, *, cliprange_value, loss_agg_mode="token-mean", norm_length=None,
                num_rows=None, sum_norm_per_seq=False):
    """The value loss aggregated with `loss_agg_mode` (critic.loss_agg_mode, resolved by `critic_agg_mode`);
    norm_length / num_rows / sum_norm_per_seq as for the actor (seq-mean-token-sum-norm)."""
    values = to_rows(output[..., 0].float(), mb, shift=True) if is_packed(mb) else shift_values(output)
    if non_loss_data:
        return {"values": values.detach()}
    mask = mb["response_mask"]
    per_token, metrics = compute_value_loss(values, mb["returns"], mb["values"], mask, cliprange_value)
    loss_sum, count, _ = aggregate_loss(per_token, mask, loss_agg_mode, norm_length=norm_length, num_rows=num_rows,
                                        sum_norm_per_seq=sum_norm_per_seq)
    metrics = {f"critic/{k}": v for k, v in metrics.items()}  # token means over the valid tokens
    metrics["critic/vf_loss"] = masked_mean(per_token.detach(), mask)
    return loss_sum, count, {**weighted(metrics, masked_count(mask)), "critic/loss_sum": loss_sum.detach(),
                             "critic/loss_count": count}


def critic_agg_mode(cfg) -> str:
    """critic.loss_agg_mode, or the actor's when it is "" (verl's critic.yaml interpolates the actor's)."""
    return cfg.critic.loss_agg_mode or cfg.actor.loss_agg_mode


def reward_model_scores(mb, output, non_loss_data=True):
    """Sequence score = the score head at the last valid token, placed at that position of a [b, s] map."""
    scores = output[..., 0].float()  # [b, s]
    if is_packed(mb):
        scores = to_rows(scores, mb, keep_first=True)
    last = (mb["lengths"] - 1).clamp(min=0)
    out = torch.zeros_like(scores)
    rows = torch.arange(scores.size(0), device=scores.device)
    out[rows, last] = scores[rows, last]
    return {"scores": out.detach()}
