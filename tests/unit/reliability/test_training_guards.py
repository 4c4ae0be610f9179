"""Faults during training, in process (one rank, the tiny GRPO config): a NaN loss from step k on, and a reward
function that fails on most completions. Asserted: no weight change on a bad step, no checkpoint lost, the run
stops with the guard's error after the configured number of steps, and the custom reward file is imported only
in reward workers."""
import math
import sys

import pytest

import rlhf_mcore.trainer.loop as trainer_mod
from rlhf_mcore.checkpoint import list_checkpoints
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from rlhf_mcore.trainer.guards import DivergedError, RewardHealthError
from rlhf_mcore.trainer.lock import LOCK_FILE
from tests.support.checkpoint import same, snapshot
from tests.support.reliability import metrics, tiny_cfg

NAN_FROM_STEP = 3  # 1-based
SMALL = ("data.train_batch_size=2", "rollout.max_response_length=8", "data.val_files=")


def test_nan_loss_skips_updates_keeps_checkpoints_and_stops(tmp_path, monkeypatch, mcore_ctx):
    seen = {"run": None, "step": 0, "weights": {}}
    real_step, real_loss = trainer_mod.train_step, trainer_mod.actor_loss

    def step(run, index):  # index: 0-based step about to run
        seen["run"], seen["step"] = run, index + 1
        seen["weights"][index] = snapshot(run.roles.actor.module)  # the weights after step `index`
        return real_step(run, index)

    def nan_loss(*args, **kwargs):
        loss_sum, count, report = real_loss(*args, **kwargs)
        return (loss_sum * math.nan if seen["step"] >= NAN_FROM_STEP else loss_sum), count, report

    monkeypatch.setattr(trainer_mod, "train_step", step)
    monkeypatch.setattr(trainer_mod, "actor_loss", nan_loss)
    cfg = tiny_cfg(tmp_path, "trainer.total_steps=8", "trainer.save_freq=1", "trainer.max_checkpoints_to_keep=2",
                   "trainer.max_bad_steps=2", *SMALL)
    want = (r"stopped at step 4: 2 steps in a row had a non-finite loss or grad norm.*trainer.max_bad_steps=2\); the "
            r"last step that applied all its updates is step 2, and no checkpoint was written or deleted since")
    with pytest.raises(DivergedError, match=want) as err:
        trainer_mod.train(cfg)
    run_dir = tmp_path / "run"
    final = snapshot(seen["run"].roles.actor.module)
    assert same(final, seen["weights"][2]) and same(seen["weights"][3], seen["weights"][2])  # no change on bad steps
    assert not same(seen["weights"][2], seen["weights"][1])  # ...while a good step changes them
    rows = [m for m in metrics(run_dir) if "actor/grad_norm" in m]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["actor/skipped_update_frac"] for r in rows] == [0.0, 0.0, 1.0, 1.0]
    assert [r["training/num_skipped_steps"] for r in rows] == [0.0, 0.0, 1.0, 2.0]
    assert all(math.isfinite(r["actor/grad_norm"]) for r in rows[:2]) and all(
        math.isnan(r["actor/grad_norm"]) for r in rows[2:])
    # bad steps write no checkpoint and delete none; the one saved right before them is set aside, intact
    assert [s for s, _ in list_checkpoints(run_dir)] == [1]
    assert checkpoint_problems(run_dir / "global_step_2.suspect") == []
    assert err.value.lines[1].startswith("global_step_2: saved just before the first skipped update, set aside")
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
    assert (run_dir / LOCK_FILE).read_text() == ""  # released


def test_failing_reward_stops_the_run_and_the_trainer_never_imports_the_reward_file(tmp_path, mcore_ctx):
    reward = tmp_path / "strict_reward.py"  # passes the start-up probe, fails on completions without '####'
    reward.write_text("def strict(data_source, solution_str, ground_truth, extra_info):\n"
                      "    return float(solution_str.split('####')[1].strip() == '0')\n")
    cfg = tiny_cfg(tmp_path, f"reward.custom_fn={reward}:strict", "reward.max_error_steps=2", "trainer.total_steps=6",
                   *SMALL)
    with pytest.raises(RewardHealthError, match=r"stopped at step 2: more than 50% of the reward calls failed or "
                                                r"timed out in 2 steps in a row"):
        trainer_mod.train(cfg)
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and all(r["reward/error_frac"] > 0.5 for r in rows)
    assert not [m for m in sys.modules if m.startswith("rlhf_mcore_custom_reward_strict_reward")]
