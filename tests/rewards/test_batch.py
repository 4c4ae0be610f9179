import os
import re
import time

import pytest

from rlhf_mcore.rewards import score_batch


def _echo_score(data_source, solution_str, ground_truth, extra_info):
    """A custom reward whose behaviour is chosen by the solution text."""
    if solution_str == "raise":
        raise RuntimeError("boom")
    if solution_str == "sleep":
        time.sleep(60)
    if solution_str == "regex":  # catastrophic backtracking: holds the GIL inside C for ages
        re.match(r"(a+)+$", "a" * 64 + "b")
    if solution_str == "die":
        os._exit(3)
    if solution_str == "no-score":
        return {"acc": 1.0}
    if solution_str == "nan":
        return float("nan")
    if solution_str == "text":
        return "1.0"
    return {"score": float(solution_str), "idx": extra_info["i"]}


def _run(solutions, **kw):
    n = len(solutions)
    infos = [{"i": i} for i in range(n)]
    return score_batch(["custom"] * n, solutions, [None] * n, infos, custom_fn=_echo_score, **kw)


def test_builtin_rewards_by_data_source():
    result = score_batch(
        ["openai/gsm8k", "gsm8k", "lighteval/MATH", "math"],
        ["#### 72", "#### 5", r"\boxed{\frac{1}{2}}", "no box"],
        ["72", "6", "0.5", "1"],
        num_workers=2,
    )
    assert result.scores == [1.0, 0.0, 1.0, 0.0]
    assert result.extra["acc"] == [1.0, 0.0, 1.0, 0.0]
    assert result.extra["pred"] == ["72", "5", r"\frac{1}{2}", None]
    assert (result.num_errors, result.num_timeouts) == (0, 0)


def test_boundary_errors_raise_before_scoring():
    with pytest.raises(ValueError, match="unknown reward data_source 'gsm8kk'. Did you mean 'gsm8k'"):
        score_batch(["gsm8kk"], ["#### 1"], ["1"])
    with pytest.raises(ValueError, match="ground_truths has 1 entries but solutions has 2"):
        score_batch(["gsm8k", "gsm8k"], ["a", "b"], ["1"])
    with pytest.raises(ValueError, match="custom_fn must be callable"):
        score_batch(["x"], ["a"], ["1"], custom_fn=42)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_errors_score_zero_and_are_counted(num_workers, caplog):
    solutions = ["0.5", "raise", "no-score", "nan", "text", "0.25"]
    result = _run(solutions, num_workers=num_workers)
    assert result.scores == [0.5, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert result.extra == {"idx": [0, None, None, None, None, 5]}
    assert (result.num_errors, result.num_timeouts) == (4, 0)
    assert "4 of 6 calls failed" in caplog.text and "RuntimeError: boom" in caplog.text


def test_hung_calls_are_killed_and_the_rest_still_scored():
    solutions = ["1", "sleep", "2", "regex", "3", "4"]
    start = time.monotonic()
    result = _run(solutions, timeout_s=2.0, num_workers=2)  # one hang per worker: they time out together
    elapsed = time.monotonic() - start
    assert result.scores == [1.0, 0.0, 2.0, 0.0, 3.0, 4.0]
    assert result.extra["idx"] == [0, None, 2, None, 4, 5]
    assert (result.num_errors, result.num_timeouts) == (0, 2)
    assert elapsed < 20.0  # two 2 s deadlines (plus a loaded machine), not 60 s of sleep


def test_dead_worker_is_an_error_and_is_replaced():
    result = _run(["1", "die", "2", "3"], num_workers=1)
    assert result.scores == [1.0, 0.0, 2.0, 3.0]
    assert (result.num_errors, result.num_timeouts) == (1, 0)


def test_custom_fn_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def length_reward(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return len(solution_str) / 10\n")
    result = score_batch(["a", "b"], ["abc", "abcdefghij"], [None, None], custom_fn=f"{path}:length_reward")
    assert result.scores == [0.3, 1.0]


def test_empty_batch():
    result = score_batch([], [], [])
    assert (result.scores, result.extra, result.num_errors, result.num_timeouts) == ([], {}, 0, 0)


def test_many_rows_keep_their_order():
    n = 300
    result = _run([str(i) for i in range(n)], num_workers=2)
    assert result.scores == [float(i) for i in range(n)]
    assert result.extra["idx"] == list(range(n))
