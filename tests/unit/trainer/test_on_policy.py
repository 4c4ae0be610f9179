"""On-policy steps (one epoch, one mini-batch) skip the old-log-prob pass: the update takes pi_old from its
own forward. Same step with and without the pass: identical update (parameters to 1e-6)."""
import math

import pytest
import torch

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.loop import train
from tests.support.paths import ROOT_STR as ROOT


def one_step(tmp_path, *overrides):
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", "trainer.save_freq=0", "trainer.resume=disable",
        "trainer.logger=[console]", "actor.ppo_mini_batch_size=4", "actor.rollout_correction=token", *overrides])
    run = train(cfg)
    params = {k: v.detach().clone() for k, v in run.roles.actor.model[0].module.named_parameters()}
    return cfg, run.history[-1], params


def test_update_is_unchanged_without_the_old_logprob_pass(tmp_path, mcore_ctx, monkeypatch):
    cfg, fast, fast_params = one_step(tmp_path / "fast")
    assert phases.is_on_policy(cfg, 16, 16)
    monkeypatch.setattr(phases, "is_on_policy", lambda *a: False)
    _, slow, slow_params = one_step(tmp_path / "slow")
    assert fast_params.keys() == slow_params.keys() and fast["actor/grad_norm"] > 0
    for name, p in fast_params.items():
        torch.testing.assert_close(p, slow_params[name], atol=1e-6, rtol=0, msg=name)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/loss", "actor/ppo_kl", "actor/entropy"):
        if key in slow:
            assert math.isclose(fast[key], slow[key], rel_tol=0, abs_tol=1e-6), (key, fast[key], slow[key])
    for key in ("rollout/mismatch_logp_abs_diff", "rollout/mismatch_kl_k3", "rollout/is_weight_mean"):
        assert key in fast and math.isfinite(fast[key]), key
    assert fast["rollout/mismatch_logp_abs_diff"] < 1e-4 and slow["rollout/mismatch_logp_abs_diff"] < 1e-4


@pytest.mark.parametrize("overrides, expected", [
    ((), True),
    (("actor.ppo_epochs=2",), False),
    (("actor.ppo_mini_batch_size=2",), False),
    (("algorithm.use_kl_in_reward=true",), False),
])
def test_the_pass_is_kept_unless_exactly_on_policy(overrides, expected):
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", ["actor.ppo_mini_batch_size=4", *overrides])
    rows_per_mini = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
    assert phases.is_on_policy(cfg, cfg.data.train_batch_size * cfg.rollout.n, rows_per_mini) is expected
