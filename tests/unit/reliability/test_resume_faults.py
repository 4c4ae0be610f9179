"""A damaged newest checkpoint: `resume=auto` warns naming the bad file, resumes from the previous one, and the
resumed run's metrics equal the straight run's; metrics.jsonl holds every step once. In process, one rank."""
import os

import rlhf_mcore.trainer.loop as trainer_mod
from rlhf_mcore.checkpoint import list_checkpoints
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from tests.support.reliability import TIMING_KEYS, metrics, tiny_cfg

SMALL = ("data.train_batch_size=2", "rollout.max_response_length=8", "data.val_files=", "trainer.save_freq=1",
         "trainer.max_checkpoints_to_keep=3", "trainer.total_steps=3")


def test_corrupt_latest_checkpoint_resumes_from_the_previous_one_with_the_same_metrics(tmp_path, mcore_ctx, capsys):
    cfg = tiny_cfg(tmp_path, *SMALL)
    trainer_mod.train(cfg)
    run_dir = tmp_path / "run"
    straight = {m["step"]: m for m in metrics(run_dir)}
    shard = sorted((run_dir / "global_step_3" / "actor").glob("*.distcp"))[0]
    with open(shard, "r+b") as f:  # 4 KiB of random bytes inside a weight file
        f.seek(512)
        f.write(os.urandom(4096))
    capsys.readouterr()
    resumed = trainer_mod.train(cfg)  # the trainer's logger writes to stdout
    assert f"skipping damaged checkpoint global_step_3: {shard}: sha256 checksum differs" in capsys.readouterr().out
    assert resumed.start_step == 2
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps == [1, 2, 3], steps  # the resumed step replaces the old record, never duplicates it
    again = metrics(run_dir)[-1]
    compared = [k for k in straight[3] if not k.startswith(TIMING_KEYS)]
    assert len(compared) > 20 and {k: again.get(k) for k in compared} == {k: straight[3][k] for k in compared}
    assert [s for s, _ in list_checkpoints(run_dir)] == [1, 2, 3]  # step 3 saved again, intact
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
