"""actor.old_log_prob=rollout: the rollout engine's log-probs are pi_old, so the old-policy forward pass is
skipped. The native engine's log-probs are the trainer's (1.3e-7 apart on CPU), so the update is the
recomputing run's: the metrics to 1e-6, the parameters to 1% of the step's move (Adam moves every weight by
about lr = 1e-3 per optimizer step, 4 here, so a 1e-7 change in a near-zero gradient can move a weight by
1e-5). The rollout mismatch is still reported, from the update's first mini-batch (at the rollout's weights)."""
import math

import pytest
import torch

from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.loop import train
from tests.support.paths import ROOT_STR as ROOT

TINY = f"{ROOT}/configs/tiny_grpo.yaml"


def one_step(tmp_path, monkeypatch, *overrides):
    """One tiny GRPO step (4 mini-batches, a reference for the KL loss): last metrics, actor parameters, and
    the loss functions each forward-only pass ran with."""
    cfg = load_config(TINY, [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", "trainer.save_freq=0", "trainer.resume=disable",
        "trainer.logger=[console]", "actor.use_kl_loss=true", *overrides])
    passes, collect = [], phases.forward_collect

    def record(models, mbs, loss_fn, *args, **kwargs):
        passes.append(loss_fn)
        return collect(models, mbs, loss_fn, *args, **kwargs)

    monkeypatch.setattr(phases, "forward_collect", record)
    run = train(cfg)
    monkeypatch.undo()
    params = {k: v.detach().clone() for k, v in run.roles.actor.model[0].module.named_parameters()}
    return run, run.history[-1], params, passes


def test_the_rollout_log_probs_replace_the_old_policy_pass(tmp_path, mcore_ctx, monkeypatch):
    run, fast, fast_params, fast_passes = one_step(tmp_path / "fast", monkeypatch, "actor.old_log_prob=rollout")
    assert not phases.is_on_policy(run.cfg, 16, run.rows_per_mini("actor"))  # 4 mini-batches: a real old pass
    assert fast_passes == [run.losses.ref]  # the reference pass only
    _, slow, slow_params, slow_passes = one_step(tmp_path / "slow", monkeypatch)
    assert len(slow_passes) == 2 and fast["actor/grad_norm"] > 0
    for name, p in fast_params.items():
        torch.testing.assert_close(p, slow_params[name], atol=4e-5, rtol=0, msg=name)  # 1% of 4 x 1e-3
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/ppo_kl"):
        assert math.isclose(fast[key], slow[key], rel_tol=0, abs_tol=1e-6), (key, fast[key], slow[key])
    for key in ("rollout/mismatch_logp_abs_diff", "rollout/mismatch_kl_k3"):  # from the first mini-batch
        assert key in fast and math.isfinite(fast[key]) and fast[key] < 1e-4, (key, fast.get(key))
    assert fast["timing_s/old_log_prob"] < 1e-3


def test_bypass_mode_skips_the_pass_too(tmp_path, mcore_ctx, monkeypatch):
    run, metrics, _, passes = one_step(tmp_path, monkeypatch, "actor.policy_loss=bypass_mode")
    assert passes == [run.losses.ref] and metrics["actor/grad_norm"] > 0
    assert metrics["rollout/mismatch_logp_abs_diff"] < 1e-4


@pytest.mark.parametrize("overrides, key", [
    (("algorithm.adv_estimator=optimal_token_baseline",), "algorithm.adv_estimator"),
    (("actor.rollout_correction=token",), "actor.rollout_correction"),
])
def test_what_needs_the_old_policy_pass_is_one_config_error(overrides, key):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["actor.old_log_prob=rollout", *overrides])
    errors = info.value.errors
    assert len(errors) == 1 and errors[0].startswith(f"{key}: ") and "actor.old_log_prob" in errors[0], errors
    load_config(TINY, list(overrides))  # fine with the pass


def test_a_bad_value_names_the_choices():
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["actor.old_log_prob=engine"])
    assert info.value.errors == ["actor.old_log_prob: must be one of recompute, rollout (got 'engine'). "
                                 "Pick one of those."]


def test_bypass_mode_keeps_the_pass_when_more_than_log_probs_come_from_it():
    bypass = ["actor.policy_loss=bypass_mode"]
    assert phases.old_from_rollout(load_config(TINY, bypass))
    otb = load_config(TINY, [*bypass, "algorithm.adv_estimator=optimal_token_baseline"])
    assert not phases.old_from_rollout(otb)  # sum pi^2 comes from the old-policy pass
