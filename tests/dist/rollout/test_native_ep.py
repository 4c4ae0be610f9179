"""The native engine at expert parallelism (gloo, 2 ranks, EP2 = DP2), both checks in one launch.

- Single turn (tests/cases/native_ep.py): every MoE forward exchanges tokens over the EP group, so its ranks
  decode in lockstep (rollout/native.py: the step and micro-batch counts are the group's maximum) even when one
  rank's rows all end at their first token and it holds more micro-batches than the other. The rows come out as
  at EP1: the same greedy tokens, log-probs within 1e-5 (fp32).
- Multi-turn (tests/cases/multi_turn_ep.py): the two ranks take different numbers of turns with different
  budgets, yet every MoE forward exchanges tokens over the EP group. Each turn the group agrees on
  max_new_tokens (its largest remaining budget) and a rank that is done calls generate([]), so the rollout
  finishes (the launch's time-out catches a hang) and each rank's rows are its rows at EP1: the same tokens and
  loss masks, log-probs within 1e-5 (fp32).
- Multi-turn partial rollouts (tests/cases/partial_ep.py): the ranks need different numbers of rounds; at EP2 the
  group agrees on each round and a rank that has its batch joins with no rows, and over two steps (samples
  carried and continued) each rank trains its EP1 rows."""
import json

import pytest

from tests.launch import worker
from tests.support.tiny_moe import tiny_moe

pytestmark = pytest.mark.dist
CASES = ("native_ep", "multi_turn_ep", "partial_ep")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    """{case: its EP2 and EP1 rows}: both cases in one 2-rank launch (a hang ends at the time-out)."""
    work = tmp_path_factory.mktemp("native_ep")
    tiny_moe(True).save_pretrained(str(work / "hf"))
    worker(2, *[(case, "--hf-dir", work / "hf", "--out", work / f"{case}.json") for case in CASES],
           extra_env={"OMP_NUM_THREADS": "1"}, timeout=300)
    return {case: json.loads((work / f"{case}.json").read_text()) for case in CASES}


def test_ep2_ranks_decode_in_lockstep_and_match_ep1(results):
    result = results["native_ep"]
    ep2, ep1 = result["ep2"]["ranks"], result["ep1"]["ranks"]
    assert ep2[0]["lengths"] == [1, 1] and ep2[1]["lengths"] == [6]  # rank 0 stopped at once, rank 1 ran on
    for two, one in zip(ep2, ep1):
        assert two["tokens"] == one["tokens"] and two["lengths"] == one["lengths"]
        gap = max(abs(a - b) for ra, rb in zip(two["logprobs"], one["logprobs"]) for a, b in zip(ra, rb))
        assert gap <= 1e-5


def test_ranks_take_different_turns_and_budgets(results):
    result = results["multi_turn_ep"]
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


def test_rows_are_the_ep1_rows_and_well_formed(results):
    result = results["multi_turn_ep"]
    for two, one in zip(result["ep2"]["ranks"], result["ep1"]["ranks"]):
        assert two["tokens"] == one["tokens"] and two["mask"] == one["mask"] and two["spans"] == one["spans"]
        gap = max(abs(a - b) for ra, rb in zip(two["logprobs"], one["logprobs"]) for a, b in zip(ra, rb))
        assert gap <= 1e-5
        for mask, spans, length in zip(two["mask"], two["spans"], two["lengths"]):
            policy = {c for start, end in spans for c in range(start, end)}
            assert [c for c in range(length) if mask[c]] == sorted(policy)  # loss mask on policy tokens only
            assert max(policy) == length - 1  # every sample ends on a policy token


def test_partial_rollouts_keep_ep_lockstep_and_train_the_ep1_rows(results):
    result = results["partial_ep"]
    ep2, ep1 = result["ep2"]["ranks"], result["ep1"]["ranks"]
    assert len(ep1[0]["calls"]) != len(ep1[1]["calls"])  # at EP1 the ranks run different numbers of rounds
    assert len(ep2[0]["calls"]) == len(ep2[1]["calls"]) == max(len(r["calls"]) for r in ep1)
    assert any(rows == 0 for r in ep2 for rows, _ in r["calls"])  # a rank with its batch joined with no rows
    assert any(s["report"]["async/samples_carried_total"] > 0 for r in ep1 for s in r["steps"])
    for two, one in zip(ep2, ep1):
        for a, b in zip(two["steps"], one["steps"]):
            assert a["prompts"] == b["prompts"] and a["tokens"] == b["tokens"] and a["mask"] == b["mask"]
            assert a["spans"] == b["spans"] and a["report"] == b["report"]
            gap = max(abs(x - y) for ra, rb in zip(a["logprobs"], b["logprobs"]) for x, y in zip(ra, rb))
            assert gap <= 1e-5
    assert any(len(spans) > 1 for s in ep2[0]["steps"] for spans in s["spans"])  # tool turns were trained
