"""save_checkpoint / load_checkpoint / load_model_weights in one process (TP1/PP1): round trip, keep-last-K,
a failed or interrupted save, and the errors at the boundary (roles, keys, shapes, optimizer kind, paths)."""
import json
from pathlib import Path

import pytest
import torch

import rlhf_mcore.checkpoint.save_load as save_load
from rlhf_mcore.checkpoint import (
    CheckpointError,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    load_model_weights,
    save_checkpoint,
)
from rlhf_mcore.checkpoint.architecture import architecture_of
from rlhf_mcore.checkpoint.layout import LATEST_FILE
from rlhf_mcore.checkpoint.optim_state import adam_steps
from tests.support.checkpoint import build_state, build_tiny, perturb, same, snapshot


def test_round_trip_keep_last_k_and_layout(mcore_ctx, tmp_path):
    state = build_state(mcore_ctx)
    saved = {}
    for step in (1, 2, 3, 4):
        perturb(state.module, step)
        saved[step] = snapshot(state.module)
        path = save_checkpoint(tmp_path, step, {"actor": state}, {"step": step, "kl": [0.1]}, mcore_ctx, keep=2)
        assert path == str(tmp_path / f"global_step_{step}")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert (tmp_path / LATEST_FILE).read_text() == "4\n"
    last = tmp_path / "global_step_4"
    files = {p.relative_to(last).as_posix() for p in last.rglob("*")}
    assert {"actor", "actor/metadata.json", "checkpoint.json", "rng/rank_00000.pt", "trainer_state.json"} <= files
    meta = json.loads((tmp_path / "global_step_4" / "checkpoint.json").read_text())
    assert meta["roles"] == {"actor": {"trainable": True, "optimizer": "FP32Optimizer",
                                       "architecture": architecture_of(state.module)}}
    assert meta["layout"] == {"tp": 1, "pp": 1, "dp": 1, "world_size": 1} and meta["step"] == 4
    fresh = build_state(mcore_ctx)
    assert load_checkpoint(find_latest(tmp_path), {"actor": fresh}, mcore_ctx) == {"step": 4, "kl": [0.1]}
    assert same(snapshot(fresh.module), saved[4]) and adam_steps(fresh.optimizer) == {0.0}


def test_failed_or_killed_save_leaves_previous_checkpoint(mcore_ctx, tmp_path, monkeypatch):
    state = build_state(mcore_ctx)
    save_checkpoint(tmp_path, 1, {"actor": state}, {"step": 1}, mcore_ctx)
    first = snapshot(state.module)
    perturb(state.module, 7)

    def disk_full(path):
        raise OSError("No space left on device")

    monkeypatch.setattr(save_load, "save_rng_file", disk_full)
    with pytest.raises(CheckpointError, match=r"writing RNG states failed on rank 0: no space left on device"):
        save_checkpoint(tmp_path, 2, {"actor": state}, {"step": 2}, mcore_ctx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST_FILE]  # tmp dir removed

    def killed(path):  # a BaseException: like a kill, nothing catches it and nothing is cleaned up
        raise KeyboardInterrupt

    monkeypatch.setattr(save_load, "save_rng_file", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, {"actor": state}, {"step": 2}, mcore_ctx)
    orphans = [p for p in tmp_path.iterdir() if p.name.startswith("global_step_2.tmp-")]
    assert len(orphans) == 1 and (orphans[0] / "actor" / "metadata.json").is_file()  # partial writes
    assert find_latest(tmp_path) == str(tmp_path / "global_step_1")
    fresh = build_state(mcore_ctx)
    assert load_checkpoint(find_latest(tmp_path), {"actor": fresh}, mcore_ctx) == {"step": 1}
    assert same(snapshot(fresh.module), first)
    assert not orphans[0].exists()  # the load cleaned the orphan up
    monkeypatch.undo()
    save_checkpoint(tmp_path, 2, {"actor": state}, {"step": 2}, mcore_ctx)
    assert find_latest(tmp_path) == str(tmp_path / "global_step_2")


def test_errors_name_roles_keys_and_shapes(mcore_ctx, tmp_path):
    state = build_state(mcore_ctx)
    ref = build_tiny(mcore_ctx, "ref")
    path = save_checkpoint(tmp_path, 1, {"actor": state}, {}, mcore_ctx, frozen={"ref": ref})
    with pytest.raises(CheckpointError, match=r"no role 'critic' in this checkpoint \(it holds: actor, ref\)"):
        load_checkpoint(path, {"critic": build_state(mcore_ctx, "critic")}, mcore_ctx)
    with pytest.raises(CheckpointError, match="role 'ref' was saved without optimizer state"):
        load_checkpoint(path, {"ref": build_state(mcore_ctx, "ref")}, mcore_ctx)
    with pytest.raises(CheckpointError, match=r"role 'actor' was saved from another architecture "
                                              r"\(ffn_hidden_size: saved 128, this run 96\)"):
        load_checkpoint(path, {"actor": build_state(mcore_ctx, ffn_hidden_size=96)}, mcore_ctx)
    meta = json.loads((Path(path) / "checkpoint.json").read_text())  # as a checkpoint from before the record:
    for role in meta["roles"].values():  # the tensor shapes still name the mismatch
        del role["architecture"]
    (Path(path) / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"shape mismatch \(checkpoint vs model\): "
                                              r"decoder.layers.mlp.linear_fc1.weight \[2, 256, 64\] vs \[2, 192, 64\]"):
        load_checkpoint(path, {"actor": build_state(mcore_ctx, ffn_hidden_size=96)}, mcore_ctx)
    with pytest.raises(CheckpointError, match=r"decoder.final_layernorm.weight \[64\] vs \[32\]"):
        load_checkpoint(path, {"actor": build_state(mcore_ctx, hidden_size=32)}, mcore_ctx)
    with pytest.raises(CheckpointError, match="saved with a FP32Optimizer and this run uses a DistributedOptimizer.*"
                                              "use_distributed_optimizer as in the saved run \\(false\\)"):
        load_checkpoint(path, {"actor": build_state(mcore_ctx, distopt=True)}, mcore_ctx)
    with pytest.raises(CheckpointError, match="extra .* must be JSON-serialisable"):
        save_checkpoint(tmp_path, 2, {"actor": state}, {"sampler": object()}, mcore_ctx)
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_checkpoint(tmp_path / "global_step_9", {"actor": state}, mcore_ctx)
    with pytest.raises(CheckpointError, match="looks like a run directory"):
        load_checkpoint(tmp_path, {"actor": state}, mcore_ctx)
    with pytest.raises(CheckpointError, match="a training checkpoint, not one model's weights. Pass one of its role"):
        load_model_weights(build_tiny(mcore_ctx), path)
    with pytest.raises(CheckpointError, match="no metadata.json: not a megatron dist-checkpoint"):
        load_model_weights(build_tiny(mcore_ctx), tmp_path)
    fresh = build_state(mcore_ctx)  # frozen roles load weights only
    load_checkpoint(path, {}, mcore_ctx, frozen={"ref": fresh.module})
    assert same(snapshot(fresh.module), snapshot(ref))


def test_load_model_weights_critic_from_actor_checkpoint(mcore_ctx, tmp_path):
    from megatron.core import dist_checkpointing

    actor = build_tiny(mcore_ctx, "actor")
    perturb(actor, 3)
    converted = tmp_path / "converted"
    converted.mkdir()
    dist_checkpointing.save(actor.sharded_state_dict(), str(converted))  # what convert_checkpoint writes
    critic = build_tiny(mcore_ctx, "critic")
    head = critic.output_layer.weight.detach().clone()
    assert load_model_weights(critic, converted) == ["output_layer.weight"]
    body = {k: v for k, v in snapshot(actor).items() if not k.startswith("output_layer")}
    assert same({k: v for k, v in snapshot(critic).items() if not k.startswith("output_layer")}, body)
    assert torch.equal(critic.output_layer.weight, head)  # value head kept as initialised
    with pytest.raises(CheckpointError, match=r"model \(reward\) does not match the checkpoint: shape mismatch "
                                              r"\(checkpoint vs model\): output_layer.weight \[256, 64\] vs \[1, 64\]"):
        load_model_weights(build_tiny(mcore_ctx, "reward"), converted)
    with pytest.raises(CheckpointError, match=r"in the checkpoint but not in the model: output_layer.weight"):
        load_model_weights(build_tiny(mcore_ctx, "actor", tie_embeddings=True), converted)
    state = build_state(mcore_ctx)  # a training checkpoint's role directory works too (optimizer keys ignored)
    perturb(state.module, 5)
    path = save_checkpoint(tmp_path / "run", 1, {"actor": state}, {}, mcore_ctx)
    ref = build_tiny(mcore_ctx, "ref")
    assert load_model_weights(ref, f"{path}/actor") == []
    assert same(snapshot(ref), snapshot(state.module))
