"""Every registered advantage estimator and policy loss runs in the real loop (one step, tiny model):
selecting any of them by config works, with finite losses."""
import math

import pytest

from rlhf_mcore.algorithms import ADVANTAGES, POLICY_LOSSES
from rlhf_mcore.config_load import load_config
from rlhf_mcore.trainer import train
from tests.conftest import ROOT


def run_one_step(tmp_path, *overrides):
    cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml", [f"trainer.output_dir={tmp_path}", "trainer.total_steps=1",
                                                         "trainer.save_freq=0", "trainer.resume=disable",
                                                         "trainer.logger=[console]", *overrides])
    metrics = train(cfg).history[-1]
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    return metrics


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
