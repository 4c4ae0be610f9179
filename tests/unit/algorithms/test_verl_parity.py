"""Parity with verl's `core_algos.py`: every shared estimator, policy loss (value, gradient w.r.t. log-probs,
metrics), KL estimator (value, gradient), aggregation mode, value loss (incl. vf_clipfrac) and KL controller
equals verl's output to 1e-7 (|ours - verl| <= 1e-7 + 1e-7 |verl|) in float64, on the inputs and goldens
that verl_golden/gen_golden.py produced by running verl's own code (commit in golden["commit"]).

Per-token outputs are compared on valid tokens: ours are 0 where the mask is 0, verl leaves values there
that no loss reads (e.g. whitened padding). Differences by design are in rlhf_mcore/algorithms/README.md.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhf_mcore.algorithms import (
    ADVANTAGES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    PolicyLossInputs,
    agg_mode_for,
    aggregate_loss,
    compute_value_loss,
    kl_penalty,
)
from tests.unit.algorithms.verl_golden.cases import ACTOR

GOLDEN = torch.load(Path(__file__).parent / "verl_golden" / "golden.pt", weights_only=True)
TOL = 1e-7  # stricter than the 1e-6 asked for: catches the old (x - mean) / (std + 1e-6) whitening


def mismatch(ours: torch.Tensor, verl: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """'' when equal to TOL (on mask), else a description of the worst element."""
    ours, verl = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(verl, dtype=torch.float64)
    if mask is not None:
        keep = mask.bool()
        ours, verl = ours[keep], verl[keep]
    excess = (ours - verl).abs() - (TOL + TOL * verl.abs())
    if excess.numel() == 0 or excess.max() <= 0:
        return ""
    i = int(excess.argmax())
    return f"max excess {excess.max():.3g} at {i}: ours {ours.flatten()[i]:.9g} vs verl {verl.flatten()[i]:.9g}"


def advantage_inputs(c: dict, name: str, params: list[str]) -> AdvantageInputs:
    kw = {"token_level_rewards": c["outcome_rewards"], "group_index": c["index"]}
    if name in ("gae", "reinforce_plus_plus", "remax", "optimal_token_baseline", "tir_optimal_token_baseline"):
        kw["token_level_rewards"] = c["token_level_rewards"]
    if name == "gae":
        kw.update(values=c["values"], gamma=float(params[0]), lam=float(params[1]))
    elif name in ("grpo", "grpo_passk"):
        kw["norm_adv_by_std"] = params[0] == "True"
    elif name == "reinforce_plus_plus":
        kw["gamma"] = float(params[0])
    elif name == "remax":
        kw["baseline_rewards"] = c["reward_baselines"]
    elif name.endswith("optimal_token_baseline"):
        kw.update(old_logp=c["old_log_probs"], sum_pi_squared=c["sum_pi_squared"],
                  is_weights=c["rollout_is_weights"] if params[0] == "True" else None)
    return AdvantageInputs(response_mask=c["response_mask"], **kw)


def ours_advantages(c: dict, key: str) -> dict:
    name, *params = key.split("/")
    adv, returns = ADVANTAGES.get(name)(advantage_inputs(c, name, params))
    return {"advantages": adv, "returns": returns}


def ours_policy_loss(c: dict, key: str) -> dict:
    name, mode, use_is, loss_type, is_level = key.split("/")
    logp = c["log_prob"].clone().requires_grad_(True)
    mask = c["response_mask"]
    inp = PolicyLossInputs(
        logp=logp, old_logp=c["old_log_prob"], advantages=c["pg_advantages"], response_mask=mask,
        clip_ratio_low=ACTOR["clip_ratio_low"], clip_ratio_high=ACTOR["clip_ratio_high"],
        clip_ratio_c=ACTOR["clip_ratio_c"], is_weights=c["rollout_is_weights"] if use_is == "True" else None,
        clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.2, kl_cov_coef=1.0,
        tau_pos=ACTOR["tau_pos"], tau_neg=ACTOR["tau_neg"], rollout_logp=c["rollout_log_probs"],
        bypass_loss_type=loss_type or "ppo_clip", bypass_is_level=is_level or None, bypass_is_threshold=2.0)
    per_token, metrics = POLICY_LOSSES.get(name)(inp)
    loss_sum, count, _ = aggregate_loss(per_token, mask, agg_mode_for(name, mode))
    loss = loss_sum / count
    (grad,) = torch.autograd.grad(loss, logp)
    return {"loss": loss, "grad": grad, **{f"actor/{k}": v for k, v in metrics.items()}}


def ours_kl(c: dict, name: str) -> dict:
    logp = c["log_prob"].clone().requires_grad_(True)
    value = kl_penalty(logp, c["ref_log_prob"], name)
    (grad,) = torch.autograd.grad((value * c["response_mask"]).sum(), logp)
    return {"value": value, "grad": grad}


def ours_agg_or_value(c: dict, key: str) -> dict:
    kind, arg, *rest = key.split("/")  # value/<clip>[/fp32][/<critic.loss_agg_mode>, default token-mean]
    mask = c["response_mask"]
    if kind == "agg":
        loss_sum, count, _ = aggregate_loss(c["loss_mat"], mask, arg, norm_length=64)
        return {"loss": loss_sum / count}
    fp32, mode = "fp32" in rest, next((r for r in rest if r != "fp32"), "token-mean")
    prefix, dtype = ("critic_", torch.float32) if fp32 else ("", torch.float64)  # fp32: a fresh critic, V ~ 0
    vpreds = c[f"{prefix}vpreds"].to(dtype).requires_grad_(True)
    per_token, metrics = compute_value_loss(vpreds, c[f"{prefix}returns"].to(dtype), c[f"{prefix}values"].to(dtype),
                                            mask, float(arg))
    # verl's seq-mean-token-sum-norm divides by the mask width when given no loss_scale_factor (its critic)
    loss_sum, count, _ = aggregate_loss(per_token, mask, mode, norm_length=mask.shape[-1])
    (grad,) = torch.autograd.grad(loss_sum / count, vpreds)
    return {"loss": loss_sum / count, "vf_clipfrac": metrics["vf_clipfrac"], "grad": grad}


OURS = {"adv": ours_advantages, "pg": ours_policy_loss, "kl": ours_kl, "agg": ours_agg_or_value,
        "value": ours_agg_or_value}


def ours(case: str, key: str) -> dict:
    kind, rest = key.split("/", 1)
    return OURS[kind](GOLDEN["cases"][case], rest if kind in ("adv", "pg", "kl") else key)


PER_TOKEN = ("advantages", "returns", "value")
ITEMS = [(case, key) for case in GOLDEN["cases"] for key in GOLDEN["results"][case]]


def mismatches(case: str, key: str, verl: dict) -> list[str]:
    got, mask = ours(case, key), GOLDEN["cases"][case]["response_mask"]
    missing = [f"{field}: not reported" for field in verl if field not in got]
    return missing + [f"{field}: {err}" for field in verl if field in got
                      for err in [mismatch(got[field], verl[field], mask if field in PER_TOKEN else None)] if err]


@pytest.mark.parametrize("case,key", ITEMS, ids=[f"{c}:{k}" for c, k in ITEMS])
def test_matches_verl(case, key):
    errors = mismatches(case, key, GOLDEN["results"][case][key])
    assert not errors, f"{key} differs from verl {GOLDEN['commit'][:8]}: " + "; ".join(errors)


def test_kl_controllers_match_verl():
    adaptive = AdaptiveKLController(value=0.05, target_kl=0.1, horizon=10000)
    fixed = FixedKLController(value=0.05)
    values = []
    for current_kl, num_steps in ((0.3, 256), (0.05, 256), (0.11, 512), (0.0, 1024), (2.0, 64)):
        adaptive.update(current_kl, num_steps)
        fixed.update(current_kl, num_steps)
        values.append((adaptive.value, fixed.value))
    verl = GOLDEN["results"]["controllers"]["kl_ctrl"]
    assert not mismatch(torch.tensor([v[0] for v in values]), verl["adaptive"])
    assert not mismatch(torch.tensor([v[1] for v in values]), verl["fixed"])


# our estimators that verl b178a3cd also has (an estimator verl lacks has nothing to compare with)
VERL_ESTIMATORS = ("gae", "gpg", "grpo", "grpo_passk", "opo", "optimal_token_baseline", "reinforce_plus_plus",
                   "reinforce_plus_plus_baseline", "remax", "rloo", "tir_optimal_token_baseline")


def test_every_shared_name_is_compared():
    compared = {tuple(key.split("/")[:2]) for case in GOLDEN["cases"] for key in GOLDEN["results"][case]}
    assert set(VERL_ESTIMATORS) <= set(ADVANTAGES) and {("adv", name) for name in VERL_ESTIMATORS} <= compared
    assert {("pg", name) for name in POLICY_LOSSES} <= compared
    assert {("kl", name) for name in KL_ESTIMATORS} <= compared


@pytest.mark.parametrize("case,key", ITEMS[::7], ids=[f"{c}:{k}" for c, k in ITEMS[::7]])
def test_a_0_1_percent_perturbation_fails(case, key):
    """The comparison can fail: verl's outputs scaled by 1.001 are reported as mismatches."""
    verl = GOLDEN["results"][case][key]
    perturbed = {f: v * 1.001 for f, v in verl.items() if v.abs().max() > 1e-2}
    if not perturbed:
        pytest.skip("all outputs ~0")
    assert len(mismatches(case, key, perturbed)) == len(perturbed)
