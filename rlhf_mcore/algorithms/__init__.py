"""RL algorithm library: pure tensor functions, registered by the names users type in the config.

    adv, returns = ADVANTAGES.get(cfg.algorithm.adv_estimator)(AdvantageInputs(...))
    estimator_needs(cfg.algorithm.adv_estimator).critic  # what it declared at registration
    per_token, pg_metrics = POLICY_LOSSES.get(cfg.actor.policy_loss)(PolicyLossInputs(...))
    mode = agg_mode_for(cfg.actor.policy_loss, cfg.actor.loss_agg_mode, cfg.actor.honor_loss_agg_mode)
    loss_sum, count, agg_metrics = aggregate_loss(per_token, mask, mode, norm_length=...)

No torch.distributed, no config objects, no `.item()`. Shapes: B responses, T response tokens.
Group estimators compact `group_index` with torch.unique (one implicit device sync on CUDA, once a step).
"""
from rlhf_mcore.algorithms import advantages_otb as _otb  # noqa: F401  (registers the OTB estimators)
from rlhf_mcore.algorithms import losses_sapo_bypass as _sapo_bypass  # noqa: F401  (registers sapo, bypass_mode)
from rlhf_mcore.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    AdvantageNeeds,
    discounted_returns,
    estimator_needs,
    gae_advantages,
)
from rlhf_mcore.algorithms.aggregate import LOSS_AGG_MODES, aggregate_loss
from rlhf_mcore.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
)
from rlhf_mcore.algorithms.losses import POLICY_LOSSES, PolicyLossInputs, agg_mode_for, compute_entropy_bonus
from rlhf_mcore.algorithms.mismatch import MISMATCH_LEVELS, MISMATCH_MODES, compute_mismatch_weights
from rlhf_mcore.algorithms.stats import masked_mean, masked_sum, masked_whiten
from rlhf_mcore.algorithms.value import compute_value_loss

__all__ = [
    "ADVANTAGES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageNeeds",
    "FixedKLController",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "MISMATCH_LEVELS",
    "MISMATCH_MODES",
    "POLICY_LOSSES",
    "PolicyLossInputs",
    "agg_mode_for",
    "aggregate_loss",
    "apply_kl_penalty",
    "compute_entropy_bonus",
    "compute_mismatch_weights",
    "compute_value_loss",
    "discounted_returns",
    "estimator_needs",
    "gae_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
]
