"""A checkpoint records each role's architecture (checkpoint/architecture.py) and a load into another one is
refused in one line naming the fields: 4 heads of 16 (2 KV groups) and 8 heads of 8 (4 groups) share every
weight shape, fused QKV included, so shape checks alone let it load and train on."""
import json
from pathlib import Path

import pytest

from rlhf_mcore.checkpoint import CheckpointError, load_checkpoint, load_model_weights, save_checkpoint
from rlhf_mcore.checkpoint.architecture import architecture_of
from tests.support.checkpoint import build_state, build_tiny

OTHER_HEADS = {"num_attention_heads": 8, "num_query_groups": 4}  # same shapes as the tiny model's 4 / 2


@pytest.fixture
def step_dir(mcore_ctx, tmp_path):
    return save_checkpoint(tmp_path / "run", 1, {"actor": build_state(mcore_ctx)}, {"step": 1}, mcore_ctx, keep=1)


def test_the_shapes_really_are_the_same(mcore_ctx):
    """The premise: without the record, nothing else would tell the two models apart."""
    ours, other = build_tiny(mcore_ctx), build_tiny(mcore_ctx, **OTHER_HEADS)
    assert {k: p.shape for k, p in ours.named_parameters()} == {k: p.shape for k, p in other.named_parameters()}
    assert architecture_of(ours)["num_attention_heads"] == 4 and architecture_of(other)["kv_channels"] == 8


def test_checkpoint_json_records_each_roles_architecture(mcore_ctx, step_dir):
    meta = json.loads((Path(step_dir) / "checkpoint.json").read_text())
    assert meta["roles"]["actor"]["architecture"] == architecture_of(build_tiny(mcore_ctx)) == {
        "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_query_groups": 2,
        "kv_channels": 16, "num_moe_experts": None, "moe_router_topk": 2, "family": "llama", "vocab_size": 250}


def test_a_resume_into_other_heads_is_refused_naming_the_fields(mcore_ctx, step_dir):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(step_dir, {"actor": build_state(mcore_ctx, **OTHER_HEADS)}, mcore_ctx)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{step_dir}: role 'actor' was saved from another architecture")
    assert "kv_channels: saved 16, this run 8; num_attention_heads: saved 4, this run 8; num_query_groups: saved 2, " \
           "this run 4" in message and "trainer.resume=restart" in message


def test_model_load_of_a_role_directory_into_other_heads_is_refused(mcore_ctx, step_dir):
    with pytest.raises(CheckpointError, match=r"actor: saved from another architecture than this actor \("
                                              r"kv_channels: saved 16, this run 8; num_attention_heads"):
        load_model_weights(build_tiny(mcore_ctx, **OTHER_HEADS), f"{step_dir}/actor")
    load_model_weights(build_tiny(mcore_ctx), f"{step_dir}/actor")  # the same architecture loads


def test_a_checkpoint_from_before_the_record_loads_as_before(mcore_ctx, step_dir):
    path = Path(step_dir) / "checkpoint.json"
    meta = json.loads(path.read_text())
    del meta["roles"]["actor"]["architecture"]  # checkpoint.json is not among its own checksums
    path.write_text(json.dumps(meta))
    assert load_checkpoint(step_dir, {"actor": build_state(mcore_ctx)}, mcore_ctx) == {"step": 1}


def test_model_load_of_a_converted_checkpoint_compares_its_hf_config(mcore_ctx, tiny_work):
    """A converted checkpoint keeps the source's hf/config.json: a model of other depth is told so by name."""
    converted = tiny_work / "mcore" / "llama_tied_1x1"
    assert json.loads((converted / "hf" / "config.json").read_text())["num_hidden_layers"] == 4
    with pytest.raises(CheckpointError, match=r"llama_tied_1x1: saved from another architecture than this actor "
                                              r"\(num_layers: saved 4, this run 2\)"):
        load_model_weights(build_tiny(mcore_ctx), converted)
