"""Checkpoint faults, in process on one rank: corrupt or truncated files, a full disk, non-finite weights, a
new checkpoint that does not verify. Asserted: the error names the file, and no good checkpoint is lost."""
import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from rlhf_mcore.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint, save_load
from rlhf_mcore.checkpoint.verify import checkpoint_problems, newest_intact, pick_resume
from rlhf_mcore.logs import MetricLogger
from tests.support.checkpoint import build_state, perturb, same, snapshot


@pytest.fixture(scope="module")
def state(mcore_ctx):
    return build_state(mcore_ctx)


def save_steps(run_dir, state, ctx, steps, keep=None) -> dict:
    """Save one checkpoint per step (weights changed in between); {step: weights}."""
    saved = {}
    for step in steps:
        perturb(state.module, step)
        saved[step] = snapshot(state.module)
        save_checkpoint(run_dir, step, {"actor": state}, {"step": step}, ctx, keep=keep)
    return saved


def corrupt(path: Path, offset: int = 1024, size: int = 4096) -> None:
    """Random bytes inside a file, its size unchanged."""
    with open(path, "r+b") as f:
        f.seek(min(offset, max(0, path.stat().st_size - size)))
        f.write(os.urandom(min(size, path.stat().st_size)))


def test_corrupt_weight_file_is_named_and_auto_resume_takes_the_previous_checkpoint(state, mcore_ctx, tmp_path,
                                                                                   caplog):
    saved = save_steps(tmp_path, state, mcore_ctx, [1, 2])
    shard = sorted((tmp_path / "global_step_2" / "actor").glob("*.distcp"))[0]
    corrupt(shard)
    with pytest.raises(CheckpointError, match=f"{shard}: sha256 checksum differs"):
        load_checkpoint(tmp_path / "global_step_2", {"actor": state}, mcore_ctx)
    with caplog.at_level("WARNING"):
        path = pick_resume(SimpleNamespace(resume="auto"), tmp_path)
    assert path == str(tmp_path / "global_step_1")
    assert f"skipping damaged checkpoint global_step_2: {shard}" in caplog.text
    assert load_checkpoint(path, {"actor": state}, mcore_ctx)["step"] == 1 and same(snapshot(state.module), saved[1])


def test_truncated_files_and_metadata(state, mcore_ctx, tmp_path):
    save_steps(tmp_path, state, mcore_ctx, [1, 2, 3])
    shard = sorted((tmp_path / "global_step_3" / "actor").glob("*.distcp"))[-1]
    os.truncate(shard, shard.stat().st_size // 2)
    meta = tmp_path / "global_step_2" / "checkpoint.json"
    meta.write_text(meta.read_text()[:100])
    assert checkpoint_problems(tmp_path / "global_step_3")[0].startswith(f"{shard}: size ")
    assert checkpoint_problems(tmp_path / "global_step_2")[0].startswith(f"{meta}: unreadable (JSONDecodeError")
    assert newest_intact(tmp_path) == str(tmp_path / "global_step_1")
    with pytest.raises(CheckpointError, match="is damaged"):
        pick_resume(SimpleNamespace(resume=str(tmp_path / "global_step_3")), tmp_path)  # named: no fallback
    for step in (1,):
        (tmp_path / f"global_step_{step}" / "trainer_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="none of its 3 checkpoint"):
        newest_intact(tmp_path)


def test_non_finite_weights_are_never_saved(state, mcore_ctx, tmp_path):
    saved = save_steps(tmp_path, state, mcore_ctx, [1], keep=1)
    with torch.no_grad():
        next(state.module.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(save_load.NonFiniteWeightsError, match="weights of actor hold inf or nan"):
        save_checkpoint(tmp_path, 2, {"actor": state}, {"step": 2}, mcore_ctx, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1] and not list(tmp_path.glob("*.tmp-*"))
    load_checkpoint(tmp_path / "global_step_1", {"actor": state}, mcore_ctx)
    assert same(snapshot(state.module), saved[1])


def test_old_checkpoints_go_only_after_the_new_one_verifies(state, mcore_ctx, tmp_path, monkeypatch):
    save_steps(tmp_path, state, mcore_ctx, [1], keep=1)
    monkeypatch.setattr(save_load, "checkpoint_problems", lambda path: [f"{path}/actor/x: injected"])
    with pytest.raises(CheckpointError, match="does not verify .*injected.*older checkpoints are kept"):
        save_steps(tmp_path, state, mcore_ctx, [2], keep=1)
    assert (tmp_path / "global_step_1").is_dir()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1\n"


@pytest.mark.parametrize("error", [  # what torch.save, megatron's writer workers and plain writes raise
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598"),
    CheckpointException("write", {0: (RuntimeError("Worker failure: [Errno 28] No space left on device"), None)})])
def test_full_disk_says_no_space_left_naming_the_path(state, mcore_ctx, tmp_path, monkeypatch, error):
    save_steps(tmp_path, state, mcore_ctx, [1], keep=1)

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(save_load, "_save_role", full)
    monkeypatch.setattr("rlhf_mcore.disk.free_bytes", lambda path: 0)  # what a full disk reports
    with pytest.raises(save_load.DiskFullError,
                       match=rf"no space left on device \(ENOSPC\) writing {tmp_path}/global_step_2"):
        save_checkpoint(tmp_path, 2, {"actor": state}, {"step": 2}, mcore_ctx, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1] and checkpoint_problems(tmp_path / "global_step_1") == []


def test_full_disk_when_writing_metrics(tmp_path, monkeypatch):
    logger = MetricLogger(str(tmp_path), ["jsonl"], enabled=True)

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logger.sinks[0], "file", Full())
    with pytest.raises(OSError, match=f"no space left on device \\(ENOSPC\\) writing {tmp_path}/metrics.jsonl"):
        logger.write(1, {"a": 1.0})


def test_metrics_are_truncated_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}, "a": {s}}}\n' for s in (1, 2, 3, 4)) + '{"step": 5, "a"')  # torn line
    MetricLogger(str(tmp_path), ["jsonl"], enabled=True, truncate_after=2).close()
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'


def test_hf_export_refuses_non_finite_weights(mcore_ctx, tmp_path, capfd):
    from megatron.core import dist_checkpointing

    from rlhf_mcore.convert.export import export_actor_to_hf
    from tests.support.checkpoint import build_tiny
    from tests.support.tiny import tiny_model_config

    model = build_tiny(mcore_ctx)
    with torch.no_grad():
        next(model.parameters()).view(-1)[:3] = float("inf")
    actor = tmp_path / "global_step_1" / "actor"  # written around save_checkpoint, which refuses it
    actor.mkdir(parents=True)
    dist_checkpointing.save(model.sharded_state_dict(), str(actor))
    run = SimpleNamespace(cfg=tiny_model_config(), run_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="HF export of .* failed \\(exit code 3\\)"):
        export_actor_to_hf(run, tmp_path / "global_step_1")
    assert "refusing to export non-finite weights: 1 of" in capfd.readouterr().err
    assert not (tmp_path / "hf_export" / "global_step_1").exists()
