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
