"""A run's identity (issue 29): the outside fault test's lost-checkpoint scenario, a directory whose checkpoint.json
files are all gone, a resume with a changed config and a re-run of a finished run. In process, one rank; the
exit code and the one-line message are those of `rlhf_mcore.train.run_training`."""
import hashlib
import json

from rlhf_mcore.checkpoint import list_checkpoints
from rlhf_mcore.checkpoint.layout import LATEST_FILE, run_id_of
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from rlhf_mcore.train import run_training
from tests.support.reliability import tiny_cfg

SMALL = ("data.train_batch_size=2", "rollout.max_response_length=8", "data.val_files=", "trainer.save_freq=1",
         "trainer.max_checkpoints_to_keep=2")


def digests(run_dir) -> dict:
    """{relative path: sha256} of every file of every checkpoint (what must survive untouched)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.glob("global_step_*/**/*")) if p.is_file()}


def test_start_over_is_refused_then_moved_aside_and_the_new_run_resumes_its_own(tmp_path, mcore_ctx, capsys):
    run_dir = tmp_path / "run"
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=3"), rank=0) == 0  # run A: keeps 2, 3
    a_files, a_id = digests(run_dir), run_id_of(run_dir / "global_step_3")
    capsys.readouterr()
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.resume=disable", "trainer.total_steps=2"), rank=0) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"  - trainer.resume: 'disable' would start over in {run_dir}, "
                                                   "which holds an earlier run (global_step_2, global_step_3"), lines
    assert digests(run_dir) == a_files  # nothing touched
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.resume=restart", "trainer.total_steps=2"), rank=0) == 0
    aside = list(run_dir.glob("restarted-*"))
    assert len(aside) == 1 and digests(aside[0]) == a_files  # run A moved aside whole, nothing deleted
    b_id = run_id_of(run_dir / "global_step_2")
    assert b_id and b_id != a_id and json.loads((run_dir / "run.json").read_text())["run_id"] == b_id
    capsys.readouterr()
    run = run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=3"), rank=0)  # plain restart, config changed
    out = capsys.readouterr().out
    assert run == 0 and "resumed from" in out and f"{run_dir}/global_step_2 at step 2" in out, out[-2000:]
    assert "config: 1 key(s) differ from the previous run" in out and "trainer.total_steps: 2 -> 3" in out
    assert len(list(run_dir.glob("config.*.yaml"))) == 1  # the previous config.yaml, kept
    assert [s for s, _ in list_checkpoints(run_dir)] == [2, 3] and run_id_of(run_dir / "global_step_3") == b_id
    assert digests(aside[0]) == a_files
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=3"), rank=0) == 0  # already complete
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["checkpoint"] == summary["checkpoint"] == str(run_dir / "global_step_3"), again  # not nulled


def test_every_checkpoint_json_deleted_stops_with_the_damage_listed(tmp_path, mcore_ctx, capsys):
    run_dir = tmp_path / "run"
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=2"), rank=0) == 0
    for meta in run_dir.glob("global_step_*/checkpoint.json"):
        meta.unlink()
    before, metrics = digests(run_dir), (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=2"), rank=0) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "none of its 2 checkpoint(s) is intact: global_step_2: " in lines[1], lines
    assert "global_step_1: " in lines[1] and "no checkpoint.json" in lines[1] and "trainer.resume=restart" in lines[1]
    assert digests(run_dir) == before and (run_dir / "metrics.jsonl").read_text() == metrics  # no fresh start
    assert (run_dir / LATEST_FILE).read_text().strip() == "2"
    assert run_training(tiny_cfg(tmp_path, *SMALL, "trainer.total_steps=1", "trainer.resume=restart"), rank=0) == 0
    assert checkpoint_problems(run_dir / "global_step_1") == [] and digests(next(run_dir.glob("restarted-*")))
