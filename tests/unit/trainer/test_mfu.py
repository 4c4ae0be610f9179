"""perf/mfu/actor of a vision LM (trainer/step_log.py `mfu_metrics`, models/flops.py): config.json nests the LM's
fields under `text_config` (transformers 5's Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE files), and the step's MFU is its
language model's: the same figure as for the flat LM fields, where the nested config used to raise KeyError
('hidden_size') at the first step of any bf16 run on a GPU with a known peak (the tiny presets run fp32 on CPU: no
peak, nothing computed)."""
import json

import pytest

from rlhf_mcore.config import load_config
from rlhf_mcore.models.flops import forward_flops_per_token
from rlhf_mcore.trainer.step_log import mfu_metrics
from tests.support.paths import CONFIGS, ROOT


@pytest.mark.parametrize("model", ["tiny_vlm", "tiny_vlm3", "tiny_vlm3_moe"])
def test_a_vision_lms_mfu_is_its_language_models(model):
    hf = json.loads((ROOT / "data" / model / "config.json").read_text())
    flat = {k: v for k, v in hf["text_config"].items()}
    assert "hidden_size" not in hf  # nested, as transformers 5 writes it
    cfg = load_config(str(CONFIGS / "tiny_vlm3_grpo.yaml"), [], check=False)
    metrics = {"perf/total_num_tokens": 1000.0, "timing_s/update_actor": 2.0}
    got = mfu_metrics(metrics, hf, cfg, 1, 1e12)["perf/mfu/actor"]
    seq = 1000.0 / (cfg.data.train_batch_size * cfg.rollout.n)
    want = forward_flops_per_token(flat, seq) * 1000.0 * 3.0 * cfg.actor.ppo_epochs / (2.0 * 1e12)
    assert got == pytest.approx(want, rel=1e-12) and got > 0
    if "moe" in model:  # the active experts (top-2 of 4, 48 wide) and the router, not all experts
        h, layers = flat["hidden_size"], flat["num_hidden_layers"]
        dense = forward_flops_per_token({**flat, "num_experts": 0, "num_local_experts": 0, "intermediate_size": 96}, 1)
        assert forward_flops_per_token(flat, 1) - dense == 2 * layers * h * 4
