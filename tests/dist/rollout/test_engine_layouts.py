"""An engine with its own copy of the model (SGLang's contract, a stand-in server on CPU) at TP2, PP2 and
TP2xPP2 with 4 gloo ranks in one launch (~35 s on 2 cores): the TP gather / PP broadcast of the actor's
weights equals the converter's HF state dict of the full actor, bitwise and in order, for an untied Qwen2
(q/k/v biases) and a tied Llama; the bucketed refresh sends exactly those tensors; each DP replica's rows
are split over all its ranks and every rank gets the replica's batch back in row order."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
pytestmark = pytest.mark.dist


def test_full_weights_and_row_split_at_tp2_pp2_and_tp2xpp2(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
           "-m", "tests.cases.engine_layouts", "--layouts", "2x1,1x2,2x2", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result) == sorted(f"{layout} {case}" for layout in ("2x1", "1x2", "2x2")
                                    for case in ("qwen2", "llama_tied"))
    assert {key: r["problems"] for key, r in result.items() if r["problems"]} == {}
    for key, r in result.items():  # 10 rows per replica: 5 + 5 over 2 model-parallel ranks, 3/3/2/2 over 4
        assert r["rows_per_rank"] == ([3, 3, 2, 2] if key.startswith("2x2") else [5, 5, 5, 5]), key


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["parallel.tp=2", "parallel.pp=2"])
def test_sglang_grpo_at_tp2_and_pp2_on_two_gpus(tmp_path, layout):
    """Two GPUs, one SGLang engine each holding the whole model: tiny GRPO runs 3 steps at TP2 / PP2, the
    engines' log-probs stay within bf16 noise of the trainer's, and every refresh gathers over TP/PP."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("sglang")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "rlhf_mcore.train", "--config", os.path.join(ROOT, "configs", "tiny_grpo.yaml"), "rollout.engine=sglang",
           layout, "model.hidden_size=256", "model.ffn_hidden_size=512", "model.dtype=bf16", "trainer.total_steps=3",
           "trainer.save_freq=0", "trainer.resume=disable", "trainer.logger=[jsonl]",
           f"trainer.output_dir={tmp_path}", "rollout.sglang.gpu_memory_utilization=0.2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT, MASTER_PORT=str(free_port())))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    for m in steps:
        assert m["rollout/mismatch_logp_abs_diff"] < 0.02 and m["perf/weight_reshard_gb"] > 0, m
