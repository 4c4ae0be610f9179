"""Multi-turn rollouts through the native engine at expert parallelism (gloo, 2 ranks, EP2 = DP2): the two ranks
take different numbers of turns with different budgets, yet every MoE forward exchanges tokens over the EP group.
Each turn the group agrees on max_new_tokens (its largest remaining budget) and a rank that is done calls
generate([]), so the rollout finishes (the subprocess timeout catches a hang) and each rank's rows are its rows
at EP1: the same tokens and loss masks, log-probs within 1e-5 (fp32). Worker: tests/cases/multi_turn_ep.py
(~20 s on 2 cores)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.ports import free_port
from tests.support.tiny_moe import tiny_moe
from tests.support.tiny_hf import ROOT

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    work = tmp_path_factory.mktemp("multi_turn_ep")
    tiny_moe(True).save_pretrained(str(work / "hf"))
    out = work / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m",
           "tests.cases.multi_turn_ep", "--hf-dir", str(work / "hf"), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_ranks_take_different_turns_and_budgets(result):
    ep1, ep2 = result["ep1"]["ranks"], result["ep2"]["ranks"]
    assert [r["lockstep"] for r in ep2] == [True, True] and [r["lockstep"] for r in ep1] == [False, False]
    assert max(ep1[0]["num_turns"]) != max(ep1[1]["num_turns"])  # at EP1 each rank runs its own turns
    budgets = [[b for _, b in r["calls"]] for r in ep1]
    assert len(budgets[0]) != len(budgets[1])
    both = list(zip(*budgets))
    assert any(a != b for a, b in both), budgets  # a turn both ranks run, with different budgets
    longest = max(budgets, key=len)
    agreed = [max(b[k] if k < len(b) else 0 for b in budgets) for k in range(len(longest))]
    for r in ep2:  # EP2: the same calls on both ranks, at the group's largest budget; a done rank asks for 0 rows
        assert [b for _, b in r["calls"]] == agreed
    assert any(rows == 0 for r in ep2 for rows, _ in r["calls"])


def test_rows_are_the_ep1_rows_and_well_formed(result):
    for two, one in zip(result["ep2"]["ranks"], result["ep1"]["ranks"]):
        assert two["tokens"] == one["tokens"] and two["mask"] == one["mask"] and two["spans"] == one["spans"]
        gap = max(abs(a - b) for ra, rb in zip(two["logprobs"], one["logprobs"]) for a, b in zip(ra, rb))
        assert gap <= 1e-5
        for mask, spans, length in zip(two["mask"], two["spans"], two["lengths"]):
            policy = {c for start, end in spans for c in range(start, end)}
            assert [c for c in range(length) if mask[c]] == sorted(policy)  # loss mask on policy tokens only
            assert max(policy) == length - 1  # every sample ends on a policy token
