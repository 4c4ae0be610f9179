"""Expert parallelism with a different number of micro-batches per rank (token budgets and packing give each
rank its own count): trainer/ep_lockstep.py pads each rank's schedule to its expert group's count with zero-loss
copies, so the MoE all-to-alls meet. At EP2 (rank 0: three micro-batches, rank 1: one) the tiny MoE actor's
log-probs before and after one update, its loss and grad norm equal EP1's (gloo, fp32); the padding changes nothing.
"""
import json

import pytest

from tests.launch import worker

pytestmark = pytest.mark.dist


def max_gap(two: list[dict], one: list[dict], key: str) -> float:
    return max(abs(a - b) for r2, r1 in zip(two, one) for x, y in zip(r2[key], r1[key]) for a, b in zip(x, y))


def test_unequal_micro_batch_counts_at_ep2_equal_ep1(tmp_path):
    out = tmp_path / "out.json"
    worker(2, ("ep_lockstep", out), extra_env={"OMP_NUM_THREADS": "1"}, timeout=300)
    r = json.loads(out.read_text())
    two, one = r["ep2"], r["ep1"]
    print({k: (two[k], one[k]) for k in ("loss", "grad_norm")})
    assert abs(two["loss"] - one["loss"]) <= 1e-6 * abs(one["loss"])
    assert abs(two["grad_norm"] - one["grad_norm"]) <= 1e-6 * one["grad_norm"]
    assert max_gap(two["ranks"], one["ranks"], "before") <= 1e-5
    assert max_gap(two["ranks"], one["ranks"], "after") <= 1e-5
    assert max_gap(one["ranks"], [{"after": x["before"]} for x in one["ranks"]], "after") > 1e-3  # the step moved
