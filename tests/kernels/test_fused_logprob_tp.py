"""Vocab-parallel (TP2, gloo on CPU) fused log-prob / entropy equals TP1 to 1e-5, values and gradients."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

WORKER = Path(__file__).with_name("tp_fused_logprob_worker.py")


@pytest.mark.dist
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_tp2_matches_tp1():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("TP2 fused_logprob_entropy OK") == 2, out[-4000:]
