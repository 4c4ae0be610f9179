"""SGLang at TP2 / PP2 on two GPUs (the CPU half of the engine-layout checks, a stand-in server with its own copy
of the model, is in tests/dist/rollout/test_native.py)."""
import json

import pytest

from tests.launch import torchrun
from tests.support.paths import TINY

pytestmark = pytest.mark.dist


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["parallel.tp=2", "parallel.pp=2"])
def test_sglang_grpo_at_tp2_and_pp2_on_two_gpus(tmp_path, layout):
    """Two GPUs, one SGLang engine each holding the whole model: tiny GRPO runs 3 steps at TP2 / PP2, the
    engines' log-probs stay within bf16 noise of the trainer's, and every refresh gathers over TP/PP."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("sglang")
    torchrun("rlhf_mcore.train", 2, "--config", TINY, "rollout.engine=sglang", layout, "model.hidden_size=256",
             "model.ffn_hidden_size=512", "model.dtype=bf16", "trainer.total_steps=3", "trainer.save_freq=0",
             "trainer.resume=disable", "trainer.logger=[jsonl]", f"trainer.output_dir={tmp_path}",
             "rollout.sglang.gpu_memory_utilization=0.2", timeout=900)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    for m in steps:
        assert m["rollout/mismatch_logp_abs_diff"] < 0.02 and m["perf/weight_reshard_gb"] > 0, m
