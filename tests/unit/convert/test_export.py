"""HF export of a training checkpoint's actor (a separate single-process, CPU-only conversion)."""
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from rlhf_mcore.checkpoint import save_checkpoint
from rlhf_mcore.convert.export import export_actor_to_hf
from rlhf_mcore.convert.mcore import full_state_dict
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.models.weights import mcore_to_hf
from tests.support.checkpoint import build_state, perturb
from tests.support.tiny import tiny_model_config


def test_export_writes_the_actor_through_the_weight_table(mcore_ctx, tmp_path):
    state = build_state(mcore_ctx)
    perturb(state.module, 11)
    path = save_checkpoint(tmp_path, 3, {"actor": state}, {}, mcore_ctx)
    run = SimpleNamespace(cfg=tiny_model_config(), run_dir=str(tmp_path))
    out = Path(export_actor_to_hf(run, path))
    assert out == tmp_path / "hf_export" / "global_step_3"
    hf_cfg = load_hf_config(run.cfg.model)
    want = {k: v.cpu() for k, v in mcore_to_hf(full_state_dict(state.module), hf_cfg, role="actor").items()}
    got = load_file(out / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and config["num_hidden_layers"] == 2 and config["vocab_size"] == 250


def test_the_export_keeps_the_stop_set_when_the_tokenizer_is_elsewhere(tmp_path):
    """model.tokenizer in a directory of its own (no generation_config.json) and model.hf_path whose
    generation_config.json lists two eos ids (as Llama-3-Instruct's does): the export has the tokenizer's files and
    a generation_config.json with the whole stop set and the model's other generation fields, as transformers
    reads it."""
    import shutil

    from transformers import GenerationConfig

    from rlhf_mcore.config.schema import ModelConfig
    from rlhf_mcore.convert.export import aux_dirs, generation_config
    from rlhf_mcore.models.hf_io import save_hf_checkpoint
    from tests.support.multi_turn import smollm2_dir
    from tests.support.tiny_hf import save_tiny

    hf = save_tiny(tmp_path / "hf", "llama_tied")
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "temperature": 0.6}))
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = Path(smollm2_dir()) / name
        if src.is_file():
            shutil.copy(src, tok / name)
    model = ModelConfig(hf_path=str(hf), tokenizer=str(tok))
    assert aux_dirs(model) == [str(hf), str(tok)]
    generation = generation_config(model)
    assert generation == {"eos_token_id": [2, 7]}  # SmolLM2's eos and end of turn are id 2: the union is 2, 7
    out = save_hf_checkpoint(tmp_path / "out", {"w": torch.zeros(2)}, {"model_type": "llama"}, aux_dirs(model),
                             generation=generation)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer.json").read_bytes() == (
        tok / "tokenizer.json").read_bytes()
    loaded = GenerationConfig.from_pretrained(out)
    assert loaded.eos_token_id == [2, 7] and loaded.temperature == 0.6


def test_export_of_a_biased_gelu_llama_gives_back_its_hf_weights(mcore_ctx, tmp_path):
    """A Llama with a bias on every linear (attention_bias + mlp_bias) and a GeGLU MLP (gelu_new), loaded from HF,
    checkpointed and exported: its HF tensors bitwise, the config fields kept, and transformers' logits."""
    from transformers import AutoModelForCausalLM

    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_load import load_hf_weights
    from rlhf_mcore.trainer.optim import build_train_state
    from tests.support.tiny_hf import load_tensors, tiny_model

    hf_model = tiny_model("llama", False, attention_bias=True, mlp_bias=True, hidden_act="gelu_new")
    hf_dir = tmp_path / "hf"
    hf_model.save_pretrained(str(hf_dir))
    cfg = tiny_model_config(hf_path=str(hf_dir))
    hf_cfg = load_hf_config(cfg.model)
    model = build_model("actor", hf_cfg, cfg.model, cfg.parallel, mcore_ctx)
    load_hf_weights(model, str(hf_dir), hf_cfg, 0, 1)
    state = build_train_state(model, cfg.actor.optim, cfg.parallel)
    path = save_checkpoint(tmp_path / "run", 1, {"actor": state}, {}, mcore_ctx)
    out = Path(export_actor_to_hf(SimpleNamespace(cfg=cfg, run_dir=str(tmp_path / "run")), path))
    want, got = load_tensors(hf_dir), load_file(out / "model.safetensors")
    assert "model.layers.1.mlp.gate_proj.bias" in got and "model.layers.1.self_attn.o_proj.bias" in got
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_act"], config["attention_bias"], config["mlp_bias"]) == ("gelu_new", True, True)
    tokens = torch.randint(0, 250, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exported = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
        assert torch.equal(exported(tokens).logits, hf_model(tokens).logits)
