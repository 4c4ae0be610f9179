"""LoRA exports (models/lora_export.py, models/full_weights.py) against the real readers: the merged HF export
loads with transformers and the PEFT adapter with peft, each giving the trainer's logits (fp32), at TP1 and
TP2 (torchrun, gloo), and for a tiny MoE's expert adapters at EP2; an actor started from the exported adapter
(model.lora_adapter_path) gives them too.
The adapter directory checks of model.lora_adapter_path name the field and the fix."""
import json
import os
import re

import pytest

from tests.cases.lora_export import SETTINGS
from tests.launch import worker
from tests.support.tiny_hf import save_tiny

pytest.importorskip("peft")
TOL = 1e-5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("lora") / "qwen2", "qwen2")


def _check(errors: dict) -> None:
    assert errors["lora_effect"] > 0.1, "the adapters must move the logits, else the test proves nothing"
    for name in ("merged", "peft", "reload"):
        assert errors[name] < TOL, (name, errors)


def test_merged_and_peft_exports_give_the_trainers_logits_tp1(hf_dir, tmp_path, mcore_ctx):
    from tests.cases.lora_export import run

    errors = run(hf_dir, tmp_path, mcore_ctx)
    print(errors)
    _check(errors)
    files = sorted(os.listdir(tmp_path / "peft_tp1"))
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "peft_tp1" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["task_type"], config["bias"]) == \
        ("LORA", 4, 8.0, "CAUSAL_LM", "none")
    assert sorted(config["target_modules"]) == sorted(SETTINGS.target_modules)
    assert not any(n.endswith("adapter_config.json") for n in os.listdir(tmp_path / "merged_tp1"))


@pytest.mark.dist
def test_merged_and_peft_exports_give_the_trainers_logits_tp2(hf_dir, tmp_path):
    proc = worker(2, ("lora_export", "--hf", hf_dir, "--work", tmp_path, "--tp", "2"),
                  extra_env={"OMP_NUM_THREADS": "1"})
    line = next(line for line in proc.stdout.splitlines() if line.startswith("lora_export tp=2"))
    print(line)
    _check({k: float(v) for k, v in re.findall(r"(\w+)=([0-9.e+-]+)", line) if k not in ("tp", "ep")})


@pytest.mark.dist
def test_expert_adapters_export_from_ep2_and_load_back(tmp_path):
    """A tiny Qwen3-MoE at EP2: each rank holds half the experts' adapters; the export gathers them (peft fuses
    them onto transformers 5's experts) and each rank loads its own half back."""
    from tests.support.tiny_moe import tiny_moe

    moe = tmp_path / "moe"
    tiny_moe(norm_topk_prob=True).save_pretrained(str(moe))
    proc = worker(2, ("lora_export", "--hf", moe, "--work", tmp_path, "--tp", "1", "--ep", "2"),
                  extra_env={"OMP_NUM_THREADS": "1"})
    line = next(line for line in proc.stdout.splitlines() if line.startswith("lora_export tp=1 ep=2"))
    print(line)
    _check({k: float(v) for k, v in re.findall(r"(\w+)=([0-9.e+-]+)", line) if k not in ("tp", "ep")})


def test_adapter_dir_errors_name_the_key_and_the_fix(hf_dir, tmp_path):
    from rlhf_mcore.models.lora_export import adapter_config, adapter_dir_errors, save_peft_adapter

    key = "model.lora_adapter_path"
    assert adapter_dir_errors(str(tmp_path / "none"), 4, 8.0, SETTINGS.target_modules)[0].startswith(
        f"{key}: no adapter_config.json and adapter_model.safetensors in ")
    save_peft_adapter(tmp_path / "a", {}, adapter_config(SETTINGS, str(hf_dir)))
    assert adapter_dir_errors(str(tmp_path / "a"), 4, 8.0, SETTINGS.target_modules) == []
    errs = adapter_dir_errors(str(tmp_path / "a"), 8, 16.0, ("q_proj", "v_proj"))
    assert len(errs) == 3 and all(e.startswith(f"{key}: the adapter in ") for e in errs)
    assert "Set model.lora_rank=4." in errs[0] and "Set model.lora_alpha=8.0." in errs[1]
    assert "Set model.target_modules" in errs[2]
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({**config, "target_modules": "all-linear"}))
    assert adapter_dir_errors(str(tmp_path / "a"), 4, 8.0, SETTINGS.target_modules) == []
