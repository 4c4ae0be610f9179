"""KL estimators, KL-shaped rewards and KL coefficient controllers.

Estimators follow J. Schulman, "Approximating KL divergence" (2020, http://joschu.net/blog/kl-approx.html),
with samples drawn from the current policy and log r = ref_logp - logp:
  k1 = -log r,  k2 = (log r)^2 / 2,  k3 = (r - 1) - log r,  abs = |log r|.
Each `name+` variant is straight-through: its forward value is `name`'s and its gradient is k2's,
(logp - ref_logp) * grad(logp), whose expectation over on-policy samples is exactly grad KL(pi || pi_ref).
Gradients never flow into `ref_logp`. Values and gradients equal verl's `kl_penalty` (k3 clamped to
[-10, 10]); verl's own `+` names raise (its forward does not strip the "+"), ours work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import masked_mean
from rlhf_mcore.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator (algorithm.kl_penalty / actor.kl_loss_type)")
KL_CONTROLLERS: Registry = Registry("KL controller (algorithm.kl_ctrl_type)")

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: beyond this k3 is numerically meaningless
_MAX_K3 = 10.0  # verl clamps the k3 estimate to [-10, 10]


def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log pi(y) - log pi_ref(y), unbiased, can be negative."""
    return logp - ref_logp


def _abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """|log pi(y) - log pi_ref(y)|."""
    return (logp - ref_logp).abs()


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = 0.5 (log pi - log pi_ref)^2, biased, low variance, non-negative."""
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(log r) - 1 - log r, log r = log pi_ref - log pi clamped to +-20; unbiased, non-negative.
    The estimate is clamped to [-10, 10] as in verl (its gradient is 0 beyond; `k3+` keeps k2's gradient)."""
    log_r = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.expm1(log_r) - log_r).clamp(-_MAX_K3, _MAX_K3)


def _straight_through(forward_fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    def estimator(logp: Tensor, ref_logp: Tensor) -> Tensor:
        k2 = _k2(logp, ref_logp)
        return forward_fn(logp, ref_logp).detach() + (k2 - k2.detach())

    estimator.__doc__ = f"Straight-through: value of [{forward_fn.__doc__}], gradient of k2."
    return estimator


for _names, _fn in ((("k1", "kl"), _k1), (("abs",), _abs), (("k2", "mse"), _k2), (("k3", "low_var_kl"), _k3)):
    for _name in _names:
        KL_ESTIMATORS.register(_name)(_fn)
        KL_ESTIMATORS.register(_name + "+")(_straight_through(_fn))


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of the policy from the reference, `kind` in KL_ESTIMATORS. [B, T] -> [B, T]."""
    return KL_ESTIMATORS.get(kind)(logp, ref_logp.detach())


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: Tensor,  # [B, T]
    logp: Tensor,  # [B, T] log-probs of the policy that sampled (old_logp)
    ref_logp: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    coef: float | Tensor,
    kind: str = "k1",
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-shaped token rewards r_t = score_t - beta * KL_t, InstructGPT (arXiv 2203.02155) Eq. 2 / Ziegler
    et al. 2019 (arXiv 1909.08593) Sec. 2.2, per token as in REINFORCE++. 0 at padding.

    Returns (token_level_rewards [B, T], metrics) with metrics["kl"] the batch mean of per-sequence token-mean
    KL (feed it, as a float, to the KL controller's `update` with num_steps = the number of responses,
    prompts x n, as verl does) and metrics["kl_coef"].
    """
    kl = kl_penalty(logp, ref_logp, kind)  # [B, T]
    rewards = torch.where(mask.bool(), token_level_scores - coef * kl, torch.zeros_like(token_level_scores))
    seq_kl = masked_mean(kl, mask, dim=-1)  # [B]
    metrics = {"kl": seq_kl.mean(), "kl_coef": torch.as_tensor(coef, dtype=kl.dtype, device=kl.device)}
    return rewards, metrics


@KL_CONTROLLERS.register("fixed")
@dataclass(slots=True)
class FixedKLController:
    """Constant KL coefficient beta."""

    value: float

    def update(self, current_kl: float, num_steps: int) -> None:
        """No-op: the coefficient stays fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@KL_CONTROLLERS.register("adaptive")
@dataclass(slots=True)
class AdaptiveKLController:
    """Adaptive beta of Ziegler et al. 2019 (arXiv 1909.08593) Sec. 2.2:
    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2),  beta_{t+1} = beta_t (1 + e_t * num_steps / horizon).
    """

    value: float
    target_kl: float
    horizon: float

    def __post_init__(self):
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"algorithm.target_kl / algorithm.kl_horizon: must be > 0 "
                f"(got {self.target_kl}, {self.horizon}). "
                "Set both to positive numbers, or use algorithm.kl_ctrl_type=fixed."
            )

    def update(self, current_kl: float, num_steps: int) -> None:
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target_kl = float(state["target_kl"])
        self.horizon = float(state["horizon"])
