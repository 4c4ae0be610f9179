"""Checkpoints never run code (checkpoint/safe_load.py): a table of tampered checkpoints, each loaded through the
paths a user takes (a resume of a training checkpoint, `model.load` of a foreign one). Each tamper would run a
command if unpickled (it touches a marker file); each must be refused in one line that names the file, with the
marker never written. The checksums are re-recorded after the tamper, as an attacker who can write the
directory would do: they are not what stops it."""
import io
import json
import os
import pickle

import pytest
import torch

from rlhf_mcore.checkpoint import CheckpointError, load_checkpoint, load_model_weights, save_checkpoint
from rlhf_mcore.checkpoint.safe_load import install, load_byte_item, read_metadata_file
from rlhf_mcore.checkpoint.verify import record_checksums
from tests.support.checkpoint import build_state, build_tiny


class Command:
    """Unpickles to os.system(command): what a planted pickle does."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def touch(marker) -> Command:
    return Command(f"touch {marker}")


def plant_metadata(role_dir, marker) -> str:
    """.metadata replaced by a pickle that runs a command."""
    (role_dir / ".metadata").write_bytes(pickle.dumps(touch(marker)))
    return ".metadata"


def plant_metadata_in_a_field(role_dir, marker) -> str:
    """The real metadata, with a command hidden in one of its fields (the object still looks right)."""
    metadata = read_metadata_file(role_dir / ".metadata")
    metadata.planner_data = {"x": touch(marker)}
    (role_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    return ".metadata"


def plant_byte_item(role_dir, marker) -> str:
    """A byte item (torch.save of an object, read back by torch.load(weights_only=False) in torch's planner)
    pointed at new bytes holding a command; the metadata itself stays clean."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = read_metadata_file(role_dir / ".metadata")
    buf = io.BytesIO()
    torch.save([touch(marker)], buf)
    (role_dir / "__planted.distcp").write_bytes(buf.getvalue())
    index = next(i for i in metadata.storage_data if isinstance(metadata.state_dict_metadata[i.fqn],
                                                                 BytesStorageMetadata))
    info = metadata.storage_data[index]
    info.relative_path, info.offset, info.length = "__planted.distcp", 0, len(buf.getvalue())
    (role_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    return "__planted.distcp"


def plant_common(role_dir, marker) -> str:
    """common.pt (megatron's non-sharded state) replaced by torch.save of a command."""
    torch.save({"x": touch(marker)}, role_dir / "common.pt")
    return "common.pt"


TAMPERS = {"metadata": plant_metadata, "metadata_field": plant_metadata_in_a_field, "byte_item": plant_byte_item,
           "common_pt": plant_common}


def rerecord_checksums(step_dir) -> None:
    meta = json.loads((step_dir / "checkpoint.json").read_text())
    meta["files"] = record_checksums(step_dir)
    (step_dir / "checkpoint.json").write_text(json.dumps(meta))


@pytest.fixture
def saved(mcore_ctx, tmp_path):
    state = build_state(mcore_ctx)
    return save_checkpoint(tmp_path / "run", 1, {"actor": state}, {"step": 1}, mcore_ctx, keep=1)


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_checkpoint_is_refused_in_one_line_and_runs_nothing(mcore_ctx, tmp_path, saved, tamper):
    marker = tmp_path / "ran"
    step_dir = saved and tmp_path / "run" / "global_step_1"
    planted = TAMPERS[tamper](step_dir / "actor", marker)
    rerecord_checksums(step_dir)
    with pytest.raises(CheckpointError) as resumed:  # trainer.resume of the run
        load_checkpoint(step_dir, {"actor": build_state(mcore_ctx)}, mcore_ctx)
    with pytest.raises(CheckpointError) as loaded:  # model.load of the role directory as a foreign checkpoint
        load_model_weights(build_tiny(mcore_ctx), step_dir / "actor")
    assert not marker.exists(), "the planted command ran"
    for info in (resumed, loaded):
        message = str(info.value)
        assert "\n" not in message and planted in message, message
        assert "refused to load: it asks for posix.system" in message, message
        assert message.endswith("Load only checkpoints you wrote or trust."), message


def test_the_checkpoints_we_write_load_and_torchs_readers_stay_restricted(mcore_ctx, tmp_path, saved):
    """The restriction admits every checkpoint we write (the round trip is tested in test_save_load.py), and with
    install() torch's own readers refuse a command too (a path that skipped check_loadable)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    install()
    role_dir = tmp_path / "run" / "global_step_1" / "actor"
    assert read_metadata_file(role_dir / ".metadata").state_dict_metadata  # ours: admitted
    marker = tmp_path / "ran"
    plant_metadata(role_dir, marker)
    with pytest.raises(CheckpointError, match="refused to load: it asks for posix.system"):
        FileSystemReader(str(role_dir)).read_metadata()
    buf = io.BytesIO()
    torch.save(touch(marker), buf)
    buf.seek(0)
    planner = DefaultLoadPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    read_item = type("ReadItem", (), {"dest_index": type("Index", (), {"fqn": "x"})()})()
    with pytest.raises(CheckpointError, match="^x: refused to load: it asks for posix.system"):
        planner.load_bytes(read_item, buf)
    assert not marker.exists()
    buf = io.BytesIO()
    torch.save({"kept": [torch.ones(2), 3, "plain"]}, buf)
    buf.seek(0)
    assert load_byte_item(buf, "ok")["kept"][1:] == [3, "plain"]


def saved_as_on_a_gpu(obj, file, monkeypatch) -> None:
    """torch.save of `obj` with its storages tagged cuda:0, as a GPU run writes them."""
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(obj, file)


def test_a_checkpoint_written_on_a_gpu_is_checked_and_read_on_a_host(mcore_ctx, tmp_path, saved, monkeypatch):
    """The HF export reads a GPU run's checkpoint with CUDA hidden (2026-12-04 on the H200: check_loadable's
    torch.load of common.pt raised "Attempting to deserialize object on a CUDA device"). The check reads on the host,
    and torch's byte-item reader maps to the host where no GPU is."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from rlhf_mcore.checkpoint.safe_load import COMMON_FILE, check_loadable

    role_dir = tmp_path / "run" / "global_step_1" / "actor"
    saved_as_on_a_gpu({"rng": torch.ones(2)}, role_dir / COMMON_FILE, monkeypatch)
    if not torch.cuda.is_available():  # the failure the check must not hit
        with pytest.raises(RuntimeError, match="deserialize object on a CUDA device"):
            torch.load(role_dir / COMMON_FILE, weights_only=True)
    check_loadable(role_dir)
    buf = io.BytesIO()
    saved_as_on_a_gpu({"kept": torch.arange(3.0)}, buf, monkeypatch)
    buf.seek(0)
    planner = DefaultLoadPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    read_item = type("ReadItem", (), {"dest_index": type("Index", (), {"fqn": "x"})()})()
    planner.load_bytes(read_item, buf)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert planner.state_dict["x"]["kept"].device.type == want
    assert torch.equal(planner.state_dict["x"]["kept"].cpu(), torch.arange(3.0))
