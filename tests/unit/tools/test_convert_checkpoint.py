"""tools/convert_checkpoint.py in one process (TP1/PP1): round trips, sharded export, bf16, reward and
critic heads, verify, and every bad-input path. Multi-rank layouts: test_convert_dist.py."""
import json

import pytest
import torch

from rlhf_mcore.models.rope import ROPE_FIELDS
from tests.support.tiny_hf import CASES, VOCAB, diff_state_dicts, load_tensors, parse_verify_lines, save_tiny
from tools.convert_checkpoint import run


def export(work, ckpt: str, name: str, *extra) -> object:
    out = work / "export" / name
    assert run(["mcore-to-hf", "--mcore-dir", str(work / "mcore" / ckpt), "--out", str(out), "--overwrite",
                *extra]) == 0
    return out


def verify(work, hf: str, ckpt: str, capsys) -> dict:
    rc = run(["verify", "--hf-dir", str(work / "hf" / hf), "--mcore-dir", str(work / "mcore" / ckpt)])
    (row,) = parse_verify_lines(capsys.readouterr().out)
    assert rc == 0 and row["passed"], row
    return row


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_and_verify_at_tp1(case, tiny_work, capsys):
    from transformers import AutoModelForCausalLM

    out = export(tiny_work, f"{case}_1x1", case)
    problems = diff_state_dicts(load_tensors(tiny_work / "hf" / case), load_tensors(out))
    assert not problems, f"{case}: {problems}"
    meta = json.loads((tiny_work / "mcore" / f"{case}_1x1" / "conversion.json").read_text())
    assert meta == {"role": "actor", "dtype": "fp32", "source": str(tiny_work / "hf" / case), "saved_tp": 1,
                    "saved_pp": 1, "saved_ep": 1, "padded_vocab_size": 256}
    reloaded = AutoModelForCausalLM.from_pretrained(str(out))  # transformers reads the export
    assert reloaded.config.tie_word_embeddings == CASES[case][1] and reloaded.config.vocab_size == VOCAB
    source = json.loads((tiny_work / "hf" / case / "config.json").read_text())
    exported = json.loads((out / "config.json").read_text())
    assert [exported.get(k) for k in ROPE_FIELDS] == [source.get(k) for k in ROPE_FIELDS]  # rope scaling kept
    row = verify(tiny_work, case, f"{case}_1x1", capsys)
    assert float(row["logits_max"]) <= 1e-4 and float(row["logprob_max"]) <= 1e-4


def test_sharded_export_past_max_shard_size(tiny_work):
    from transformers import AutoModelForCausalLM

    out = export(tiny_work, "qwen2_1x1", "qwen2_sharded", "--max-shard-size", "64KiB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 5 and not (out / "model.safetensors").exists()
    assert not diff_state_dicts(load_tensors(tiny_work / "hf" / "qwen2"), load_tensors(out))
    AutoModelForCausalLM.from_pretrained(str(out))


def test_bf16_conversion(tiny_work, capsys):
    mc = tiny_work / "mcore" / "qwen2_bf16"
    assert run(["hf-to-mcore", "--hf-dir", str(tiny_work / "hf" / "qwen2"), "--out", str(mc), "--dtype", "bf16"]) == 0
    assert json.loads((mc / "conversion.json").read_text())["dtype"] == "bf16"
    row = verify(tiny_work, "qwen2", "qwen2_bf16", capsys)
    print(f"bf16 verify: {row}")
    out = export(tiny_work, "qwen2_bf16", "qwen2_bf16")
    expected = {k: v.to(torch.bfloat16) for k, v in load_tensors(tiny_work / "hf" / "qwen2").items()}
    assert not diff_state_dicts(expected, load_tensors(out))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_reward_model_score_head(tiny_work, capsys):
    from transformers import AutoModelForSequenceClassification

    hf_dir = save_tiny(tiny_work / "hf" / "llama_rm", "llama_tied", seq_cls=True)
    assert run(["hf-to-mcore", "--hf-dir", str(hf_dir), "--out", str(tiny_work / "mcore" / "llama_rm")]) == 0
    row = verify(tiny_work, "llama_rm", "llama_rm", capsys)
    assert row["role"] == "reward" and "logprob_max" not in row
    out = export(tiny_work, "llama_rm", "llama_rm")
    assert not diff_state_dicts(load_tensors(hf_dir), load_tensors(out))
    assert AutoModelForSequenceClassification.from_pretrained(str(out)).config.num_labels == 1


def test_critic_from_a_causal_lm_exports_a_one_label_classifier(tiny_work, capsys):
    from transformers import AutoModelForSequenceClassification

    hf_dir = tiny_work / "hf" / "qwen2"
    mc = tiny_work / "mcore" / "qwen2_critic"
    assert run(["hf-to-mcore", "--hf-dir", str(hf_dir), "--out", str(mc), "--role", "critic"]) == 0
    out = export(tiny_work, "qwen2_critic", "qwen2_critic")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
    tensors = load_tensors(out)
    assert tensors["score.weight"].shape == (1, 64) and "lm_head.weight" not in tensors
    trunk = {k: v for k, v in load_tensors(hf_dir).items() if k != "lm_head.weight"}
    assert not diff_state_dicts(trunk, {k: v for k, v in tensors.items() if k != "score.weight"})
    AutoModelForSequenceClassification.from_pretrained(str(out))
    with pytest.raises(ValueError, match=r"verify compares a critic head only against a \*ForSequenceClass"):
        run(["verify", "--hf-dir", str(hf_dir), "--mcore-dir", str(mc)])


def test_export_of_a_training_checkpoint_role_dir(tiny_work, mcore_ctx):
    """run/global_step_N/actor holds {"model": ..., "optimizer": ...}: export it with --hf-config."""
    from megatron.core import dist_checkpointing

    from rlhf_mcore.convert.mcore import build_for_conversion, describe_checkpoint, load_converted

    ckpt = tiny_work / "mcore" / "qwen2_1x1"
    hf_cfg, _, role, dtype = describe_checkpoint(ckpt)
    model = build_for_conversion(hf_cfg, role, mcore_ctx, dtype)
    load_converted(model, ckpt)
    role_dir = tiny_work / "run" / "global_step_3" / "actor"
    role_dir.mkdir(parents=True)
    dist_checkpointing.save({"model": model.sharded_state_dict()}, str(role_dir))
    out = tiny_work / "export" / "trained_actor"
    assert run(["mcore-to-hf", "--mcore-dir", str(role_dir), "--hf-config", str(tiny_work / "hf" / "qwen2"),
                "--out", str(out)]) == 0
    assert not diff_state_dicts(load_tensors(tiny_work / "hf" / "qwen2"), load_tensors(out))


def test_bad_inputs_raise_errors_that_name_the_file_or_field(tiny_work, tmp_path, monkeypatch):
    hf = str(tiny_work / "hf" / "qwen2")
    ckpt = str(tiny_work / "mcore" / "qwen2_1x1")
    with pytest.raises(ValueError, match=rf"{tmp_path}/config.json: no config.json"):
        run(["hf-to-mcore", "--hf-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"qwen2_1x1: already exists and is not empty. Pass --overwrite"):
        run(["hf-to-mcore", "--hf-dir", hf, "--out", ckpt])
    with pytest.raises(ValueError, match=r"no conversion.json or hf/config.json beside the weights. Pass --hf-config"):
        run(["mcore-to-hf", "--mcore-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"cannot tell the model role from the directory. Pass --role"):
        run(["mcore-to-hf", "--mcore-dir", str(tmp_path), "--hf-config", hf, "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"--max-shard-size: cannot parse '5 parsecs'"):
        run(["mcore-to-hf", "--mcore-dir", ckpt, "--out", str(tmp_path / "o"), "--max-shard-size", "5 parsecs"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"mcore-to-hf runs in one process"):
        run(["mcore-to-hf", "--mcore-dir", ckpt, "--out", str(tmp_path / "o")])
    monkeypatch.delenv("WORLD_SIZE")
    for name, change, message in (
        ("gpt2", dict(architectures=["GPT2LMHeadModel"], model_type="gpt2"), r"unsupported architecture"),
        ("rope", dict(rope_parameters={"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}),
         r"rope scaling type 'longrope'"),
        ("rope_field", dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
         r"rope_parameters.factor is missing for rope type 'llama3'"),
    ):
        bad = tmp_path / name
        save_tiny(bad, "qwen2")
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps(dict(config, **change)))
        with pytest.raises(ValueError, match=message):
            run(["hf-to-mcore", "--hf-dir", str(bad), "--out", str(tmp_path / f"{name}_out")])
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # nothing half-written


def test_loading_a_full_state_dict_checks_keys_and_shapes(mcore_ctx):
    from rlhf_mcore.convert.mcore import build_for_conversion, load_full_state_dict
    from rlhf_mcore.models.weights import hf_to_mcore
    from tests.support.tiny_hf import tiny_model

    hf = tiny_model("mistral", False)
    cfg = dict(hf.config.to_dict(), architectures=["MistralForCausalLM"])
    full = hf_to_mcore(hf.state_dict(), cfg)
    model = build_for_conversion(cfg, "actor", mcore_ctx, "fp32")
    with pytest.raises(ValueError, match=r"src: missing tensor 'decoder.final_layernorm.weight' for model parameter"):
        load_full_state_dict(model, {k: v for k, v in full.items() if "final" not in k}, 0, 1, source="src")
    bad = dict(full, **{"decoder.layers.1.mlp.linear_fc2.weight": torch.zeros(64, 95)})
    with pytest.raises(ValueError, match=r"'decoder.layers.1.mlp.linear_fc2.weight' gives shape \[64, 95\] on TP rank "
                                         r"0/1, but the model parameter has \[64, 96\]"):
        load_full_state_dict(model, bad, 0, 1, source="src")


def test_doctests():
    import doctest

    from tools import convert_checkpoint

    result = doctest.testmod(convert_checkpoint)
    assert result.attempted > 0 and result.failed == 0
