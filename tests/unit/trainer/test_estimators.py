"""Every registered advantage estimator and policy loss runs in the real loop (one step, tiny model):
selecting any of them by config works, with finite losses."""
import math

import pytest

from rlhf_mcore.algorithms import ADVANTAGES, POLICY_LOSSES
from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train
from tests.support.paths import ROOT_STR as ROOT


def run_one_step(tmp_path, *overrides, with_run=False):
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", [f"trainer.output_dir={tmp_path}", "trainer.total_steps=1",
                                                         "trainer.save_freq=0", "trainer.resume=disable",
                                                         "trainer.logger=[console]", *overrides])
    run = train(cfg)
    metrics = run.history[-1]
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert 0.0 <= metrics["response_length/clip_ratio"] <= 1.0
    return (metrics, run) if with_run else metrics


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_estimator_runs_in_the_loop(name, tmp_path, mcore_ctx):
    extra = ["algorithm.use_kl_in_reward=true"] if name == "reinforce_plus_plus" else []
    metrics = run_one_step(tmp_path, f"algorithm.adv_estimator={name}", *extra)
    assert "critic/advantages/mean" in metrics
    assert ("critic/vf_loss" in metrics) == (name == "gae")


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_runs_in_the_loop(name, tmp_path, mcore_ctx):
    metrics = run_one_step(tmp_path, f"actor.policy_loss={name}", "actor.use_kl_loss=true", "actor.kl_loss_type=k3+")
    assert "actor/pg_loss" in metrics and "actor/kl_loss" in metrics
    assert metrics["timing_s/ref"] > 0  # the reference forward is timed on its own, as in verl


def test_adaptive_kl_controller_counts_responses(tmp_path, mcore_ctx):
    """verl updates the adaptive KL coefficient with the number of responses (prompts x n) as n_steps."""
    metrics, run = run_one_step(tmp_path, "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl_type=adaptive",
                                "algorithm.kl_coef=0.1", "algorithm.target_kl=0.001", "algorithm.kl_horizon=100",
                                with_run=True)
    error = min(max(metrics["actor/reward_kl"] / 0.001 - 1.0, -0.2), 0.2)
    responses = run.cfg.data.train_batch_size * run.cfg.rollout.n
    assert run.kl_ctrl.value == pytest.approx(0.1 * (1 + error * responses / 100))
