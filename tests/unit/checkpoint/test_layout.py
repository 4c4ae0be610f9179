"""Checkpoint directories on disk: which one is the latest, pruning, orphans, trainer.resume (no models)."""
import json
from types import SimpleNamespace

import pytest

from rlhf_mcore.checkpoint import CheckpointError, find_latest, list_checkpoints, resolve_resume
from rlhf_mcore.checkpoint.layout import FORMAT, LATEST_FILE, META_FILE, prune, read_meta, remove_orphans, write_latest


def fake_checkpoint(run_dir, step, complete=True):
    path = run_dir / f"global_step_{step}"
    (path / "actor").mkdir(parents=True)
    if complete:
        (path / META_FILE).write_text(json.dumps({"format": FORMAT, "step": step, "roles": {}, "layout": {}}))
    return path


def test_latest_follows_the_pointer_and_skips_incomplete_and_tmp_dirs(tmp_path):
    assert find_latest(tmp_path) is None and find_latest(tmp_path / "absent") is None
    for step in (2, 10):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 12, complete=False)  # killed before checkpoint.json
    (tmp_path / "global_step_14.tmp-deadbeef").mkdir()  # killed before the rename
    assert find_latest(tmp_path) == str(tmp_path / "global_step_10")  # no pointer: highest complete step
    write_latest(tmp_path, 2)
    assert find_latest(tmp_path) == str(tmp_path / "global_step_2")  # the pointer wins
    (tmp_path / LATEST_FILE).write_text("12\n")  # pointer to an incomplete dir: fall back
    assert find_latest(tmp_path) == str(tmp_path / "global_step_10")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 10]


def test_prune_keeps_the_newest_k_and_orphans_are_removed(tmp_path):
    paths = {s: fake_checkpoint(tmp_path, s) for s in (1, 2, 3, 4)}
    (tmp_path / "global_step_5.tmp-0123abcd").mkdir()
    assert prune(tmp_path, 2, newest=paths[4]) == [paths[1], paths[2]]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert [p.name for p in remove_orphans(tmp_path)] == ["global_step_5.tmp-0123abcd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "global_step_4"]
    with pytest.raises(CheckpointError, match="max_checkpoints_to_keep: must be >= 1"):
        prune(tmp_path, 0, newest=paths[4])


def test_resolve_resume(tmp_path):
    cfg = lambda resume: SimpleNamespace(resume=resume)  # noqa: E731
    assert resolve_resume(cfg("auto"), tmp_path) is None
    assert resolve_resume(cfg("disable"), tmp_path) is None
    fake_checkpoint(tmp_path, 3)
    latest = fake_checkpoint(tmp_path, 7)
    write_latest(tmp_path, 7)
    assert resolve_resume(cfg("auto"), tmp_path) == str(latest)
    assert resolve_resume(cfg("disable"), tmp_path) is None
    assert resolve_resume(cfg(str(tmp_path / "global_step_3")), "elsewhere") == str(tmp_path / "global_step_3")
    assert resolve_resume(cfg(str(tmp_path)), "elsewhere") == str(latest)  # a run dir: its newest checkpoint
    with pytest.raises(CheckpointError, match=r"trainer.resume: checkpoint not found \(got '.*global_step_9'\)"):
        resolve_resume(cfg(str(tmp_path / "global_step_9")), tmp_path)
    (tmp_path / "other").mkdir()
    with pytest.raises(CheckpointError, match="not a checkpoint written by save_checkpoint"):
        resolve_resume(cfg(str(tmp_path / "other")), tmp_path)


def test_read_meta_says_what_the_directory_is(tmp_path):
    fake_checkpoint(tmp_path, 1)
    with pytest.raises(CheckpointError, match="looks like a run directory; pass one of its global_step_N"):
        read_meta(tmp_path)
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "metadata.json").write_text("{}")
    with pytest.raises(CheckpointError, match="plain model dist-checkpoint .* load_model_weights"):
        read_meta(converted)
    with pytest.raises(CheckpointError, match="unfinished save"):
        read_meta(fake_checkpoint(tmp_path, 5, complete=False).rename(tmp_path / "global_step_5.tmp-1"))
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        read_meta(tmp_path / "nope")
    (tmp_path / "global_step_1" / META_FILE).write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(CheckpointError, match="unknown checkpoint format 'other/9'"):
        read_meta(tmp_path / "global_step_1")
