"""The native engine on a tiny 4-layer model: one launch per layout (each costs 10-25 s on 2 cores).

- world size 1 (plain python): KV-cache greedy == a naive no-cache loop; log-probs == a full forward;
  stop tokens / strings / max_new_tokens / n; micro-batching; padded vocab; modes, memory, registry.
- TP2, PP2, TP2xPP2 (torchrun + gloo, `dist`): every rank returns the identical batch, equal to TP1's
  (tokens exactly, log-probs to 1e-5) for greedy, seeded sampling, and sampling with stop tokens.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support.ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "rollout_worker.py")
CHECKS = ["greedy_matches_naive_loop", "logprobs_match_full_forward", "layout_and_n", "stop_tokens_and_length",
          "stop_strings", "micro_batching", "vocab_padding_never_sampled", "ddp_wrapped_model",
          "modes_memory_registry", "static_decode_matches_eager"]
SCENARIOS = ["greedy", "sampled", "stopped"]


def launch(out_dir, nproc: int, tp: int, pp: int) -> list[dict]:
    """Run the worker at one layout; every rank's saved batches."""
    args = [WORKER, "--tp", str(tp), "--pp", str(pp), "--out", str(out_dir)]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    if nproc == 1:
        cmd = [sys.executable] + args
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] + args
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"worker failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(nproc)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("rollout_tp1")
    batches = launch(out_dir, 1, 1, 1)[0]
    with open(out_dir / "checks.json") as f:
        return batches, json.load(f)


def test_checks_are_all_reported(reference):
    assert sorted(reference[1]) == sorted(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_single_rank(reference, check):
    result = reference[1][check]
    assert result == "ok", result


def assert_same_batch(got: dict, want: dict, where: str) -> None:
    for key in ("tokens", "prompt_lengths", "response_lengths"):
        assert torch.equal(got[key], want[key]), f"{where}: {key}\n{got[key]}\n!=\n{want[key]}"
    assert got["finish_reasons"] == want["finish_reasons"], where
    torch.testing.assert_close(got["rollout_logprobs"], want["rollout_logprobs"], atol=1e-5, rtol=0, msg=where)


@pytest.mark.dist
@pytest.mark.parametrize("nproc,tp,pp", [(2, 2, 1), (2, 1, 2), (4, 2, 2)], ids=["tp2", "pp2", "tp2xpp2"])
def test_layout_matches_tp1(reference, tmp_path, nproc, tp, pp):
    ranks = launch(tmp_path, nproc, tp, pp)
    for name in SCENARIOS:
        for r, batches in enumerate(ranks):
            assert_same_batch(batches[name], reference[0][name], f"tp{tp} pp{pp} rank {r} {name} vs tp1")
            for key in ("tokens", "rollout_logprobs"):  # replicas agree bit for bit
                assert torch.equal(batches[name][key], ranks[0][name][key]), f"rank {r} {name} {key} vs rank 0"
