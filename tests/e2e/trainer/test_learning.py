"""GRPO learns: on the tiny vowel task (reward = vowel fraction of the response) a random tiny model's
mean reward rises by at least 0.3 within 12 steps with a fixed seed (measured: 0.02 -> 0.82)."""
import json
import os

import pytest

from tests.launch import cli
from tests.support.paths import ROOT_STR as ROOT


@pytest.mark.slow
def test_grpo_raises_reward_on_the_tiny_task(tmp_path):
    cli("rlhf_mcore.train", "--config", os.path.join(ROOT, "configs", "tiny_grpo.yaml"),
        f"trainer.output_dir={tmp_path}", "trainer.save_freq=0", "trainer.resume=disable",
        "trainer.total_steps=12", "trainer.logger=jsonl", "data.train_batch_size=8", "rollout.n=8",
        "actor.ppo_mini_batch_size=8", "actor.micro_batch_size_per_gpu=16", "actor.optim.lr=1e-2")
    rewards = [json.loads(line)["critic/score/mean"] for line in open(tmp_path / "metrics.jsonl")]
    assert len(rewards) == 12
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards
