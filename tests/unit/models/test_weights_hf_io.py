"""HF checkpoint directories (rlhf_mcore/models/hf_io.py): sharded writes that transformers reads back,
atomic output directories, and errors that name the file."""
import json

import pytest
import torch

from rlhf_mcore.models import hf_io
from tests.support.tiny_hf import diff_state_dicts, tiny_model


def test_sharded_save_is_read_back_by_us_and_by_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama", False)
    cfg = dict(model.config.to_dict(), architectures=["LlamaForCausalLM"])
    sd = model.state_dict()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "tokenizer_config.json").write_text("{}")
    out = hf_io.save_hf_checkpoint(tmp_path / "out", sd, cfg, tmp_path / "src", max_shard_bytes=100_000)
    index = json.loads((out / hf_io.SAFETENSORS_INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in sd.values())
    assert (out / "tokenizer_config.json").is_file() and not (out / hf_io.SAFETENSORS_FILE).exists()
    loaded, source = hf_io.load_hf_state_dict(out)
    assert source.endswith(hf_io.SAFETENSORS_INDEX) and not diff_state_dicts(sd, loaded)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert not diff_state_dicts(sd, reloaded.state_dict())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dir left


def test_plan_shards_never_splits_a_tensor():
    sd = {"a": torch.zeros(10), "b": torch.zeros(100), "c": torch.zeros(1)}
    assert hf_io.plan_shards(sd, 50) == [["a"], ["b"], ["c"]]
    assert hf_io.plan_shards(sd, 10**6) == [["a", "b", "c"]]


def test_atomic_dir_leaves_nothing_on_error_and_refuses_to_clobber(tmp_path):
    with pytest.raises(RuntimeError):
        with hf_io.atomic_dir(tmp_path / "out") as tmp:
            (tmp / "half.bin").write_text("x")
            raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").write_text("x")
    with pytest.raises(ValueError, match=r"out: already exists and is not empty. Pass --overwrite"):
        with hf_io.atomic_dir(tmp_path / "out"):
            pass
    with hf_io.atomic_dir(tmp_path / "out", overwrite=True) as tmp:
        (tmp / "new").write_text("y")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["new"]


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path}/config.json: no config.json"):
        hf_io.read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json: not valid JSON"):
        hf_io.read_hf_config(tmp_path)
    with pytest.raises(ValueError, match=r"no weights found \(looked for model.safetensors.index.json"):
        hf_io.load_hf_state_dict(tmp_path)
    (tmp_path / hf_io.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    with pytest.raises(ValueError, match=r"index.json: lists shards that do not exist: .*model-1.safetensors"):
        hf_io.load_hf_state_dict(tmp_path)
    (tmp_path / hf_io.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match=r"index.json: no 'weight_map' entries"):
        hf_io.load_hf_state_dict(tmp_path)


def test_duplicate_tensor_across_shards_is_an_error(tmp_path):
    from safetensors.torch import save_file

    for name in ("a.safetensors", "b.safetensors"):
        save_file({"w": torch.zeros(2)}, str(tmp_path / name))
    index = {"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}}
    (tmp_path / hf_io.SAFETENSORS_INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"b.safetensors: tensor 'w' also appears in another shard"):
        hf_io.load_hf_state_dict(tmp_path)


def test_torch_bin_checkpoints_are_read(tmp_path):
    torch.save({"w": torch.arange(3.0)}, tmp_path / hf_io.TORCH_BIN_FILE)
    sd, source = hf_io.load_hf_state_dict(tmp_path)
    assert torch.equal(sd["w"], torch.arange(3.0)) and source.endswith("pytorch_model.bin")


def test_doctests():
    import doctest

    assert doctest.testmod(hf_io).failed == 0
