"""Policy losses, registered by the name users type in `actor.policy_loss`.

Every loss has the same signature: `fn(PolicyLossInputs) -> (per_token_loss [B, T], metrics)`.
The per-token loss is to be MINIMISED and is 0 at padding; reduce it with `aggregate.aggregate_loss`.
Metrics are detached 0-dim tensors over the valid tokens of the call: pg_clipfrac, pg_clipfrac_lower,
ppo_kl (k1 estimate of KL(pi_old || pi) = mean(old_logp - logp), from the clamped log-ratio where the
loss clamps it, as verl does), ratio_mean, ratio_max, ratio_min.
Gradients flow only through `logp`: advantages, old log-probs and IS weights are detached.
Values, gradients w.r.t. logp and metrics equal verl's `core_algos.py` (tests/unit/algorithms/test_verl_parity.py)
when aggregated with `agg_mode_for(name, loss_agg_mode)`: gspo and sapo always aggregate with
seq-mean-token-mean, geo_mean with a mean over all rows, as in verl (`honor_loss_agg_mode` lifts that).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import masked_count, masked_max, masked_mean, masked_min, masked_sum
from rlhf_mcore.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss (actor.policy_loss)")

_MAX_LOG_RATIO = 20.0  # clamp on log(pi / pi_old) before exp, for numerical safety


@dataclass(kw_only=True, slots=True)
class PolicyLossInputs:
    """Everything any policy loss may read. Fields a loss does not use are ignored."""

    logp: Tensor  # [B, T] log pi_theta(y_t), differentiable
    old_logp: Tensor  # [B, T] log pi_old(y_t) of the policy that generated the data
    advantages: Tensor  # [B, T]
    response_mask: Tensor  # [B, T]
    clip_ratio_low: float = 0.2  # ratio >= 1 - low (vanilla, gspo, clip_cov); IS-weight / log-ratio bound
    clip_ratio_high: float = 0.2  # ratio <= 1 + high; DAPO clip-higher uses high > low (e.g. 0.28)
    clip_ratio_c: float | None = 3.0  # dual-clip bound for negative advantages (vanilla); None disables
    is_weights: Tensor | None = None  # [B, T] rollout/trainer mismatch weights (mismatch.py), scale the loss
    clip_cov_ratio: float = 2e-4  # clip_cov: fraction of valid tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # clip_cov: covariance window lower bound
    clip_cov_ub: float = 5.0  # clip_cov: covariance window upper bound
    kl_cov_ratio: float = 2e-4  # kl_cov: fraction of valid tokens that get the KL penalty
    kl_cov_coef: float = 0.1  # kl_cov: penalty coefficient (verl's policy_loss.ppo_kl_coef)
    generator: torch.Generator | None = None  # clip_cov random selection (same device as the tensors)
    tau_pos: float = 1.0  # sapo: gate temperature for A > 0
    tau_neg: float = 1.05  # sapo: gate temperature for A <= 0
    rollout_logp: Tensor | None = None  # [B, T] log pi_rollout(y_t) of the engine (bypass_mode's old policy)
    bypass_loss_type: str = "ppo_clip"  # bypass_mode: ppo_clip | reinforce
    bypass_is_level: str | None = None  # bypass_mode reinforce: None | token | sequence IS weights
    bypass_is_threshold: float = 2.0  # bypass_mode reinforce: IS weights truncated at this

    def __post_init__(self):
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(
                f"actor.clip_ratio_c: must be > 1 for dual-clip PPO (got {self.clip_ratio_c}). "
                "Use e.g. 3.0, or null to disable dual clipping."
            )
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0:
            raise ValueError(
                f"actor.clip_ratio_low/high: must be >= 0 "
                f"(got {self.clip_ratio_low}, {self.clip_ratio_high}). Use e.g. 0.2 / 0.28."
            )


def _log_ratio(inp: PolicyLossInputs) -> Tensor:
    """log(pi / pi_old), clamped to +-20. [B, T]"""
    return (inp.logp - inp.old_logp.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _finish(loss: Tensor, inp: PolicyLossInputs, metrics: dict[str, Tensor],
            apply_is_weights: bool = True) -> tuple[Tensor, dict]:
    """Apply IS weights, zero the padding, detach the metrics."""
    if apply_is_weights and inp.is_weights is not None:
        loss = loss * inp.is_weights.detach()
    loss = torch.where(inp.response_mask.bool(), loss, torch.zeros_like(loss))
    return loss, {k: v.detach() for k, v in metrics.items()}


def _metrics(ratio: Tensor, inp: PolicyLossInputs, clipfrac: Tensor | float = 0.0,
             clipfrac_lower: Tensor | float = 0.0, log_ratio: Tensor | None = None) -> dict[str, Tensor]:
    """ppo_kl = mean(-log_ratio) over valid tokens; log_ratio defaults to the raw logp - old_logp."""
    mask = inp.response_mask
    ratio = ratio.detach()
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    log_ratio = inp.logp - inp.old_logp if log_ratio is None else log_ratio
    return {
        "pg_clipfrac": zero + clipfrac,
        "pg_clipfrac_lower": zero + clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio.detach(), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
        "ratio_min": masked_min(ratio, mask),
    }


def _clipped_surrogate(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate max(-A r, -A clip(r, 1-low, 1+high)) and where the clipped term won. [B, T]"""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@POLICY_LOSSES.register("vanilla")
def compute_vanilla_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, Schulman et al. 2017 (arXiv 1707.06347) Eq. 7: -min(r A, clip(r, 1-e, 1+e) A),
    with asymmetric bounds 1-low / 1+high (DAPO Clip-Higher, arXiv 2503.14476 Sec. 3.1) and, for A < 0, the
    dual clip of Ye et al. 2020 (arXiv 1912.09729): max(min(r A, clip(r) A), c A), i.e. loss <= -c A.
    pg_clipfrac: fraction where the clipped term is active; pg_clipfrac_lower: where the dual clip is.
    """
    adv = inp.advantages.detach()
    log_ratio = _log_ratio(inp)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_surrogate(ratio, adv, inp.clip_ratio_low, inp.clip_ratio_high)
    mask = inp.response_mask
    lower_frac = 0.0
    if inp.clip_ratio_c is not None:
        dual = -adv * inp.clip_ratio_c
        lower = (adv < 0) & (loss > dual)
        loss = torch.where(lower, dual, loss)
        lower_frac = masked_mean(lower.to(ratio.dtype), mask)
    metrics = _metrics(ratio, inp, masked_mean(clipped.to(ratio.dtype), mask), lower_frac, log_ratio)
    return _finish(loss, inp, metrics)


@POLICY_LOSSES.register("gspo")
def compute_gspo_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token objective, Zheng et al. 2025 (arXiv 2507.18071): s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]
    with the length-normalised sequence ratio s_i = exp(mean_t log(pi / pi_old)), clipped like PPO with
    1-low / 1+high. Its gradient equals sequence-level GSPO when aggregated with `seq-mean-token-mean`.
    ratio_* metrics describe s_i.
    """
    adv = inp.advantages.detach()
    mask = inp.response_mask
    log_ratio = inp.logp - inp.old_logp.detach()  # [B, T]
    seq_log_ratio = masked_sum(log_ratio, mask, -1) / masked_count(mask, -1).clamp(min=1)  # [B]
    log_s = inp.logp - inp.logp.detach() + seq_log_ratio.detach()[:, None]  # [B, T]
    ratio = torch.exp(log_s.clamp(max=10.0))
    loss, clipped = _clipped_surrogate(ratio, adv, inp.clip_ratio_low, inp.clip_ratio_high)
    return _finish(loss, inp, _metrics(ratio, inp, masked_mean(clipped.to(ratio.dtype), mask)))


@POLICY_LOSSES.register("gpg")
def compute_gpg_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG, Chu et al. 2025 (arXiv 2504.02546): plain policy gradient, loss = -A log pi(y_t); no ratio, no
    clipping (pair it with adv_estimator=gpg). Ratio metrics are reported for monitoring only.
    """
    loss = -inp.advantages.detach() * inp.logp
    return _finish(loss, inp, _metrics(torch.exp(_log_ratio(inp)), inp))


def _centered_cov(inp: PolicyLossInputs) -> Tensor:
    """Per-token covariance term (A - mean A)(log pi - mean log pi) over valid tokens, detached. [B, T]"""
    mask = inp.response_mask
    adv, logp = inp.advantages.detach(), inp.logp.detach()
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _rank(keys: Tensor, descending: bool) -> Tensor:
    """Rank of every element of `keys` in sorted order (stable), same shape."""
    order = keys.flatten().argsort(descending=descending, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=keys.device)
    return ranks.view_as(keys)


@POLICY_LOSSES.register("clip_cov")
def compute_clip_cov_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov, Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617):
    on top of the PPO clipped surrogate, pick at random max(1, floor(ratio * N)) valid, unclipped tokens whose
    covariance (A - mean A)(log pi - mean log pi) lies in (lb, ub) and remove their gradient (loss 0).
    The ratio is not clamped (verl). Metric pg_clipfrac (verl's name): fraction of valid tokens cut.
    """
    mask = inp.response_mask.bool()
    adv = inp.advantages.detach()
    ratio = torch.exp(inp.logp - inp.old_logp.detach())
    loss, clipped = _clipped_surrogate(ratio, adv, inp.clip_ratio_low, inp.clip_ratio_high)
    cov = _centered_cov(inp)
    eligible = mask & ~clipped & (cov > inp.clip_cov_lb) & (cov < inp.clip_cov_ub)
    num_cut = torch.floor(inp.clip_cov_ratio * masked_count(mask)).clamp(min=1)
    keys = torch.rand(cov.shape, generator=inp.generator, device=cov.device)
    cut = eligible & (_rank(torch.where(eligible, keys, 2.0), descending=False) < num_cut)
    loss = torch.where(cut, torch.zeros_like(loss), loss)
    return _finish(loss, inp, _metrics(ratio, inp, masked_mean(cut.to(ratio.dtype), mask)))


@POLICY_LOSSES.register("kl_cov")
def compute_kl_cov_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov, Cui et al. 2025 (arXiv 2505.22617): unclipped surrogate -A r, plus kl_cov_coef *
    |log(pi / pi_old)| on the max(1, floor(ratio * N)) valid tokens with the largest covariance
    (A - mean A)(log pi - mean log pi). The ratio is not clamped and ppo_kl is mean |log r| (both verl).
    Metric kl_cov_frac: fraction of valid tokens penalised.
    """
    mask = inp.response_mask.bool()
    log_ratio = inp.logp - inp.old_logp.detach()
    ratio = torch.exp(log_ratio)
    cov = _centered_cov(inp)
    num_pick = torch.floor(inp.kl_cov_ratio * masked_count(mask)).clamp(min=1)
    keys = torch.where(mask, cov, torch.full_like(cov, float("-inf")))
    picked = mask & (_rank(keys, descending=True) < num_pick)
    penalty = torch.where(picked, inp.kl_cov_coef * log_ratio.abs(), torch.zeros_like(log_ratio))
    loss = -inp.advantages.detach() * ratio + penalty
    metrics = _metrics(ratio, inp)
    metrics["ppo_kl"] = masked_mean(log_ratio.detach().abs(), mask)
    metrics["kl_cov_frac"] = masked_mean(picked.to(ratio.dtype), mask)
    return _finish(loss, inp, metrics)


@POLICY_LOSSES.register("geo_mean")
def compute_geo_mean_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO objective, Zhao et al. 2025 (arXiv 2507.20673): sequence term A_i * prod_t rho_t^(1/|o_i|) with
    token-level sign-aware clipping in log space, rho_t clipped to [exp(-low), exp(high)] (paper: 0.4 each):
    log-ratio term sgn(A) * min(sgn(A) log rho_t, sgn(A) clip(log rho_t)). A_i = token-mean advantage.

    The sequence loss -A_i * exp(mean_t term) is broadcast to each valid token; verl averages it over all
    rows (`agg_mode_for`: seq-mean-all-rows). IS weights enter as one weight per sequence, their geometric
    mean exp(mean_t log w_t) (verl). pg_clipfrac / pg_clipfrac_lower: tokens whose log-ratio is outside the
    bounds with A > 0 / A < 0. ratio_* metrics describe the sequence ratio.
    """
    mask = inp.response_mask
    adv = inp.advantages.detach()
    log_ratio = inp.logp - inp.old_logp.detach()
    clamped = log_ratio.clamp(-inp.clip_ratio_low, inp.clip_ratio_high)
    sign = torch.sign(adv)
    term = sign * torch.minimum(sign * log_ratio, sign * clamped)  # [B, T]
    length = masked_count(mask, -1).clamp(min=1).to(log_ratio.dtype)  # [B]
    seq_ratio = torch.exp(masked_sum(term, mask, -1) / length)  # [B]
    seq_adv = masked_sum(adv, mask, -1) / length  # [B]
    seq_loss = -seq_adv * seq_ratio  # [B]
    if inp.is_weights is not None:
        log_w = torch.log(inp.is_weights.detach() + 1e-10)
        seq_loss = seq_loss * torch.exp(masked_sum(log_w, mask, -1) / length)
    loss = seq_loss[:, None].expand_as(log_ratio)
    outside = (log_ratio != clamped).to(log_ratio.dtype)
    seq_ratio_tok = seq_ratio[:, None].expand_as(log_ratio)
    metrics = _metrics(seq_ratio_tok, inp, masked_mean(outside * (adv > 0), mask),
                       masked_mean(outside * (adv < 0), mask))
    return _finish(loss, inp, metrics, apply_is_weights=False)


@POLICY_LOSSES.register("cispo")
def compute_cispo_loss(inp: PolicyLossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO objective, MiniMax-M1 (arXiv 2506.13585): loss = -sg(clip(r, 1-low, 1+high)) A log pi(y_t),
    so every token keeps a gradient and only the IS weight is truncated. The paper sets no lower bound (use
    clip_ratio_low=1.0). pg_clipfrac: tokens with r outside the bounds; pg_clipfrac_lower: 0 (both verl).
    """
    mask = inp.response_mask
    log_ratio = _log_ratio(inp)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - inp.clip_ratio_low, 1.0 + inp.clip_ratio_high).detach()
    loss = -weight * inp.advantages.detach() * inp.logp
    outside = masked_mean((ratio.detach() != weight).to(ratio.dtype), mask)
    return _finish(loss, inp, _metrics(ratio, inp, outside, 0.0, log_ratio))


def compute_entropy_bonus(
    entropy: Tensor, response_mask: Tensor, entropy_coeff: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Entropy regularisation term -c * H(pi(.|s_t)) per token (PPO, arXiv 1707.06347 Eq. 9, c2 S term), to be
    ADDED to the policy per-token loss before aggregation. entropy [B, T] -> (term [B, T], {"entropy": mean}).
    """
    term = torch.where(response_mask.bool(), -entropy_coeff * entropy, torch.zeros_like(entropy))
    return term, {"entropy": masked_mean(entropy.detach(), response_mask)}


# verl aggregates these losses its own way, whatever `actor.loss_agg_mode` says (`honor_loss_agg_mode` lifts it)
FIXED_AGG_MODES = {"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-all-rows"}


def agg_mode_for(policy_loss: str, loss_agg_mode: str, honor_loss_agg_mode: bool = False) -> str:
    """The aggregation mode a policy loss is reduced with: verl's fixed one for gspo / sapo / geo_mean
    (FIXED_AGG_MODES) unless `honor_loss_agg_mode`, else `loss_agg_mode`.

    >>> agg_mode_for("gspo", "token-mean"), agg_mode_for("gspo", "token-mean", True)
    ('seq-mean-token-mean', 'token-mean')
    """
    if honor_loss_agg_mode:
        return loss_agg_mode
    return FIXED_AGG_MODES.get(policy_loss, loss_agg_mode)
