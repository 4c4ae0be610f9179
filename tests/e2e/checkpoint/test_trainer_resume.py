"""The trainer resumes exactly: 3 steps straight vs a second run resumed from the first run's step-2
checkpoint (trainer.resume=<path>) give identical step-3 metrics (rollout, rewards, losses, grad norms)."""
import json
from pathlib import Path

import pytest

from tests.launch import cli
from tests.support.paths import CONFIGS
from tests.support.reliability import TIMING_KEYS

pytestmark = pytest.mark.slow


def train(out: Path, *overrides: str) -> list[dict]:
    """Three steps of the tiny PPO preset through the CLI; its metrics.jsonl (the log is out.log)."""
    cli("rlhf_mcore.train", "--config", CONFIGS / "tiny_ppo.yaml", "trainer.total_steps=3", "trainer.export_hf=false",
        f"trainer.output_dir={out}", *overrides, log=out.with_suffix(".log"))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_ppo_run_resumed_from_step_two_matches_the_straight_run(tmp_path):
    straight = train(tmp_path / "a", "trainer.save_freq=2")
    resumed = train(tmp_path / "b", f"trainer.resume={tmp_path / 'a' / 'global_step_2'}")
    want = [m for m in straight if m.get("step") == 3][-1]
    got = [m for m in resumed if m.get("step") == 3][-1]
    assert [m.get("step") for m in resumed if "actor/pg_loss" in m] == [3]  # only step 3 ran
    compared = [k for k in want if not k.startswith(TIMING_KEYS)]
    assert len(compared) > 20 and {k: got.get(k) for k in compared} == {k: want[k] for k in compared}
    again = train(tmp_path / "a", "trainer.save_freq=2")  # the finished run started again: nothing to do
    assert "run: already complete (step 3 of 3" in (tmp_path / "a.log").read_text() and again == straight
