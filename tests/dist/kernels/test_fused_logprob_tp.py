"""Vocab-parallel (TP2) fused log-prob / entropy equals TP1, values and gradients.

CPU: gloo, to 1e-5 (`-m dist`). GPU: NCCL with the Triton path, to 1e-4 (`-m gpu`, needs 2 GPUs).
"""
import pytest
import torch
import torch.distributed as dist

from tests.launch import worker


def launch(device: str) -> None:
    proc = worker(2, ("fused_logprob_tp",), extra_env={"OMP_NUM_THREADS": "1", "TP_WORKER_DEVICE": device},
                  timeout=240)
    out = proc.stdout + proc.stderr
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
