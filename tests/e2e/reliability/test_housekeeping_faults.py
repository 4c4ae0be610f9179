"""Housekeeping faults without a model (issue 29): an incomplete checkpoint.json, a directory holding two runs,
an undeletable old checkpoint, a live run's directory deleted, an HF export killed or failed."""
import json
import shutil
from types import SimpleNamespace

import pytest

from rlhf_mcore.checkpoint import CheckpointError, layout
from rlhf_mcore.checkpoint.layout import FORMAT, META_FILE, prune, read_meta, write_latest
from rlhf_mcore.checkpoint.verify import newest_intact
from rlhf_mcore.convert import export
from rlhf_mcore.trainer.lock import RunDirLocked, RunLock


def fake(run_dir, step, run_id="a", **meta):
    path = run_dir / f"global_step_{step}"
    path.mkdir(parents=True)
    record = {"format": FORMAT, "step": step, "roles": {}, "layout": {}, "run_id": run_id, **meta}
    (path / META_FILE).write_text(json.dumps({k: v for k, v in record.items() if v is not None}))
    return path


def test_incomplete_checkpoint_json_is_damaged_not_a_key_error(tmp_path):
    fake(tmp_path, 1, roles=None, layout=None)
    with pytest.raises(CheckpointError, match=r"checkpoint.json: incomplete \(missing or malformed: roles, layout\)"):
        read_meta(tmp_path / "global_step_1")
    with pytest.raises(CheckpointError, match="none of its 1 checkpoint.* global_step_1: .*incomplete"):
        newest_intact(tmp_path)


def test_two_runs_in_one_directory_resume_follows_latest_and_prune_spares_the_other(tmp_path):
    a = {s: fake(tmp_path, s, "A") for s in (5, 6)}  # run A, finished
    b = {s: fake(tmp_path, s, "B") for s in (3, 4)}  # run B, killed -9 after step 4
    write_latest(tmp_path, 4)
    assert newest_intact(tmp_path) == str(b[4])  # the run `latest` names, not A's higher step
    assert prune(tmp_path, 1, newest=b[4]) == [b[3]]  # only B's older ones
    assert a[5].is_dir() and a[6].is_dir() and b[4].is_dir()


def test_an_undeletable_old_checkpoint_is_a_warning(tmp_path, monkeypatch, caplog):
    paths = {s: fake(tmp_path, s) for s in (1, 2, 3)}

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(layout, "retire", refuse)
    with caplog.at_level("WARNING"):
        assert prune(tmp_path, 1, newest=paths[3]) == []
    assert f"{paths[1]}: could not delete this old checkpoint (PermissionError" in caplog.text
    assert all(p.is_dir() for p in paths.values())


def test_a_live_runs_deleted_directory_keeps_its_lock(tmp_path):
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        shutil.rmtree(run_dir)
        with pytest.raises(RunDirLocked, match=r"is in use by another run \(pid \d+ on host"):
            RunLock(run_dir).acquire()
    RunLock(run_dir).acquire().release()  # free once the live run ends


def test_a_killed_or_failed_export_is_redone(tmp_path, monkeypatch):
    ckpt = fake(tmp_path, 2)
    out = tmp_path / "hf_export" / "global_step_2"
    calls = []

    def convert(model_cfg, actor, dest, rc=[1, 0, 0]):  # noqa: B006 - the first call fails
        calls.append(dest)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "model.safetensors").write_text("w")
        return rc[len(calls) - 1]

    monkeypatch.setattr(export, "_convert_in_subprocess", convert)
    run = SimpleNamespace(cfg=SimpleNamespace(model=None), run_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="exit code 1.*The next run .* redoes it"):
        export.export_actor_to_hf(run, ckpt, reuse=True)
    (out.parent / ".global_step_2.tmp-abc").mkdir()  # what a killed conversion leaves
    assert export.export_actor_to_hf(run, ckpt, reuse=True) == str(out) and len(calls) == 2
    assert (out / export.DONE_FILE).is_file() and not list(out.parent.glob(".global_step_2.*"))
    export.export_actor_to_hf(run, ckpt, reuse=True)
    assert len(calls) == 2  # finished: not redone
    (ckpt / META_FILE).write_text((ckpt / META_FILE).read_text() + " ")  # the step saved again
    export.export_actor_to_hf(run, ckpt, reuse=True)
    assert len(calls) == 3
