"""Vocab-parallel (TP2) fused log-prob / entropy equals TP1, values and gradients.

CPU: gloo, to 1e-5 (`-m dist`). GPU: NCCL with the Triton path, to 1e-4 (`-m gpu`, needs 2 GPUs).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

WORKER = Path(__file__).with_name("tp_fused_logprob_worker.py")


def launch(device: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TP_WORKER_DEVICE": device}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "tests.cases.fused_logprob_tp"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=WORKER.parents[2])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count(f"TP2 fused_logprob_entropy OK ({device})") == 2, out[-4000:]


@pytest.mark.dist
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_tp2_matches_tp1_gloo_cpu():
    launch("cpu")


@pytest.mark.gpu
@pytest.mark.dist
def test_tp2_matches_tp1_nccl_triton():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    launch("cuda")
