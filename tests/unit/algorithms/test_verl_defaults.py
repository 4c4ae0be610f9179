"""Defaults to defaults: every config default we share with verl, and every default of the pure policy-loss
inputs, equals verl's default at the pinned commit (golden["defaults"]: verl's own flattened
`_generated_ppo_trainer.yaml`, read by verl_golden/gen_golden.py, `${oc.select:...}` resolved as OmegaConf does).
Together with test_verl_parity.py (same outputs for the same arguments), our defaults give verl's numbers."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlhf_mcore.algorithms import PolicyLossInputs
from rlhf_mcore.config import Config
from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.losses import critic_agg_mode

GOLDEN = torch.load(Path(__file__).parent / "verl_golden" / "golden.pt", weights_only=True)
VERL, VERL_RAW = GOLDEN["defaults"], GOLDEN["defaults_raw"]

# our config key -> verl's key (sections renamed: actor_rollout_ref.actor -> actor, ...), for every knob we share
CONFIG_KEYS = {
    "actor.policy_loss": "actor.policy_loss.loss_mode", "actor.clip_ratio_low": "actor.clip_ratio_low",
    "actor.clip_ratio_high": "actor.clip_ratio_high", "actor.clip_ratio_c": "actor.clip_ratio_c",
    "actor.loss_agg_mode": "actor.loss_agg_mode", "actor.entropy_coeff": "actor.entropy_coeff",
    "actor.use_kl_loss": "actor.use_kl_loss", "actor.kl_loss_coef": "actor.kl_loss_coef",
    "actor.kl_loss_type": "actor.kl_loss_type", "actor.ppo_epochs": "actor.ppo_epochs",
    "actor.tau_pos": "actor.tau_pos", "actor.tau_neg": "actor.tau_neg",
    "actor.kl_cov_ratio": "actor.policy_loss.kl_cov_ratio", "actor.kl_cov_coef": "actor.policy_loss.ppo_kl_coef",
    "critic.cliprange_value": "critic.cliprange_value", "critic.loss_agg_mode": "critic.loss_agg_mode",
    "critic.ppo_epochs": "critic.ppo_epochs",
    **{f"{role}.optim.{ours}": f"{role}.{theirs}" for role in ("actor", "critic") for ours, theirs in (
        ("lr", "optim.lr"), ("weight_decay", "optim.weight_decay"), ("adam_beta1", "optim.betas[0]"),
        ("adam_beta2", "optim.betas[1]"), ("grad_clip", "grad_clip"), ("min_lr_ratio", "optim.min_lr_ratio"),
        ("lr_schedule", "optim.lr_scheduler_type"))},
    "rollout.n": "rollout.n", "rollout.temperature": "rollout.temperature", "rollout.top_p": "rollout.top_p",
    "rollout.top_k": "rollout.top_k", "rollout.val_temperature": "rollout.val_kwargs.temperature",
    "algorithm.adv_estimator": "algorithm.adv_estimator", "algorithm.gamma": "algorithm.gamma",
    "algorithm.lam": "algorithm.lam",
    "algorithm.norm_adv_by_std": "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.use_kl_in_reward": "algorithm.use_kl_in_reward", "algorithm.kl_penalty": "algorithm.kl_penalty",
    "algorithm.kl_ctrl_type": "algorithm.kl_ctrl.type", "algorithm.kl_coef": "algorithm.kl_ctrl.kl_coef",
    "algorithm.target_kl": "algorithm.kl_ctrl.target_kl", "algorithm.kl_horizon": "algorithm.kl_ctrl.horizon",
}
# PolicyLossInputs field -> verl's key: the defaults of the pure functions themselves
LOSS_INPUT_KEYS = {
    "clip_ratio_low": "actor.clip_ratio_low", "clip_ratio_high": "actor.clip_ratio_high",
    "clip_ratio_c": "actor.clip_ratio_c", "clip_cov_ratio": "actor.policy_loss.clip_cov_ratio",
    "clip_cov_lb": "actor.policy_loss.clip_cov_lb", "clip_cov_ub": "actor.policy_loss.clip_cov_ub",
    "kl_cov_ratio": "actor.policy_loss.kl_cov_ratio", "kl_cov_coef": "actor.policy_loss.ppo_kl_coef",
    "tau_pos": "actor.tau_pos", "tau_neg": "actor.tau_neg",
}
# names that differ but are one KL estimator: verl's kl_penalty_forward treats each pair as one case (and the
# parity goldens kl/<name> give equal outputs, checked below)
SAME_NAME = {"kl": "k1", "low_var_kl": "k3"}


def verl_value(key: str, defaults: dict = VERL):
    name, _, index = key.partition("[")
    value = defaults[name]
    return value[int(index[:-1])] if index else value


def ours_value(cfg: Config, key: str):
    if key == "critic.loss_agg_mode":
        return critic_agg_mode(cfg)  # "" = the actor's, as verl's critic.yaml interpolates it
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def same(ours, theirs) -> bool:
    if isinstance(ours, str) or isinstance(theirs, str):
        return SAME_NAME.get(theirs, theirs) == SAME_NAME.get(ours, ours)
    return type(ours) is type(theirs) and ours == theirs if isinstance(ours, bool) else float(ours) == float(theirs)


def differences(defaults: dict = VERL) -> list[str]:
    cfg = Config()
    found = [f"{ours} = {ours_value(cfg, ours)!r}, verl {theirs} = {verl_value(theirs, defaults)!r}"
             for ours, theirs in CONFIG_KEYS.items() if not same(ours_value(cfg, ours), verl_value(theirs, defaults))]
    fields = {f.name: f.default for f in dataclasses.fields(PolicyLossInputs)}
    return found + [f"PolicyLossInputs.{ours} = {fields[ours]!r}, verl {theirs} = {verl_value(theirs, defaults)!r}"
                    for ours, theirs in LOSS_INPUT_KEYS.items() if not same(fields[ours], verl_value(theirs, defaults))]


def test_our_defaults_are_verls():
    assert not differences(), "defaults differ from verl " + GOLDEN["commit"][:8] + ": " + "; ".join(differences())


def test_every_compared_key_exists_in_both():
    cfg = Config()
    for ours, theirs in CONFIG_KEYS.items():
        ours_value(cfg, ours), verl_value(theirs)  # a KeyError / AttributeError names a renamed key


def test_equivalent_names_are_one_estimator_in_verl():
    for case in GOLDEN["cases"]:
        for theirs, ours in SAME_NAME.items():
            a, b = GOLDEN["results"][case][f"kl/{theirs}"], GOLDEN["results"][case][f"kl/{ours}"]
            assert all(torch.equal(a[f], b[f]) for f in a), (case, theirs, ours)


def test_critic_follows_the_actor_like_verls_interpolation():
    assert VERL_RAW["critic.loss_agg_mode"] == "${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}"
    cfg = load_config(None, ["actor.loss_agg_mode=seq-mean-token-mean"], check=False)
    assert critic_agg_mode(cfg) == "seq-mean-token-mean"
    cfg = load_config(None, ["actor.loss_agg_mode=seq-mean-token-mean", "critic.loss_agg_mode=token-mean"], check=False)
    assert critic_agg_mode(cfg) == "token-mean"  # the critic's own mode wins (our old behaviour)


@pytest.mark.parametrize("key", ["actor.policy_loss.ppo_kl_coef", "actor.clip_ratio_high", "critic.loss_agg_mode"])
def test_a_changed_verl_default_is_reported(key):
    changed = {**VERL, key: "seq-mean-token-sum" if key == "critic.loss_agg_mode" else VERL[key] * 1.5}
    assert any(key in line for line in differences(changed))
