"""The trainer resumes exactly: 3 steps straight vs a second run resumed from the first run's step-2
checkpoint (trainer.resume=<path>) give identical step-3 metrics (rollout, rewards, losses, grad norms)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port

from tests.support.paths import ROOT
pytestmark = pytest.mark.slow
TIMING_KEYS = ("timing", "perf/", "mem")


def train(out: Path, *overrides: str) -> list[dict]:
    cmd = [sys.executable, "-m", "rlhf_mcore.train", "--config", str(ROOT / "configs" / "tiny_ppo.yaml"),
           "trainer.total_steps=3", "trainer.export_hf=false", f"trainer.output_dir={out}", *overrides]
    log = out.with_suffix(".log")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # not this process's
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=600).returncode
    assert rc == 0, log.read_text()[-5000:]
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
