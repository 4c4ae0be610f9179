"""R3 through SGLang on one GPU, the whole loop: configs/tiny_moe_grpo.yaml with rollout.engine=sglang and
actor.router_replay=R3 (SGLang's returned routed experts replayed by every trainer pass; the conversion is checked on
CPU and against the engine in tests/unit/rollout/test_sglang_routing.py)."""
import json

import pytest

from tests.launch import cli
from tests.support.paths import ROOT_STR as ROOT
from tests.support.tiny_moe import gpu_moe_dir

pytestmark = pytest.mark.dist


@pytest.mark.gpu
def test_tiny_moe_grpo_with_r3_on_sglang(tmp_path):
    """configs/tiny_moe_grpo.yaml on SGLang with actor.router_replay=R3 (bf16, the GPU-sized tiny MoE), 3 steps:
    every trainer pass replays SGLang's experts, so the old pass stays within bf16 noise of the sampler (a replay
    misaligned by one token or layer would route to other experts and move the log-probs far more)."""
    pytest.importorskip("sglang")
    out = cli("rlhf_mcore.train", "--config", f"{ROOT}/configs/tiny_moe_grpo.yaml",
              f"model.hf_path={gpu_moe_dir(tmp_path / 'hf')}", "model.dtype=bf16", "rollout.engine=sglang",
              "actor.router_replay=R3", "rollout.sglang.gpu_memory_utilization=0.3", "trainer.total_steps=3",
              "trainer.save_freq=0", "trainer.resume=disable", "trainer.export_hf=false", "trainer.logger=[jsonl]",
              f"trainer.output_dir={tmp_path / 'run'}", timeout=900)
    assert "R3, every pass replays the experts the rollout used" in out.stdout + out.stderr
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    print([{k: round(m[k], 5) for k in ("rollout/mismatch_logp_abs_diff", "rollout/mismatch_kl_k3", "actor/pg_loss")}
           for m in steps])
    assert len(steps) == 3
    for m in steps:
        assert m["rollout/mismatch_logp_abs_diff"] < 0.02 and m["actor/pg_loss"] == m["actor/pg_loss"], m
