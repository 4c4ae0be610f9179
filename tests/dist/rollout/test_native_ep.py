"""The native engine at expert parallelism (gloo, 2 ranks): every MoE forward exchanges tokens over the EP group,
so its ranks decode in lockstep (rollout/native.py: the step and micro-batch counts are the group's maximum) even
when one rank's rows all end at their first token and it holds more micro-batches than the other. The rows come
out as at EP1: the same greedy tokens, log-probs within 1e-5 (fp32)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.tiny_moe import tiny_moe
from tests.support.tiny_hf import ROOT

pytestmark = pytest.mark.dist


def test_ep2_ranks_decode_in_lockstep_and_match_ep1(tmp_path):
    tiny_moe(True).save_pretrained(str(tmp_path / "hf"))
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m",
           "tests.cases.native_ep", "--hf-dir", str(tmp_path / "hf"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    ep2, ep1 = result["ep2"]["ranks"], result["ep1"]["ranks"]
    assert ep2[0]["lengths"] == [1, 1] and ep2[1]["lengths"] == [6]  # rank 0 stopped at once, rank 1 ran on
    for two, one in zip(ep2, ep1):
        assert two["tokens"] == one["tokens"] and two["lengths"] == one["lengths"]
        gap = max(abs(a - b) for ra, rb in zip(two["logprobs"], one["logprobs"]) for a, b in zip(ra, rb))
        assert gap <= 1e-5
