import sys
import time
import types

import pytest

from rlhf_mcore.rewards import RewardPool, score_batch

# A custom reward whose behaviour is chosen by the solution text. It lives in a file so that worker processes
# can load it by its "file.py:function" spec, as a user's reward would be.
ECHO_REWARD = '''
import os, re, time

def echo(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise RuntimeError("boom")
    if solution_str == "sleep":
        time.sleep(60)
    if solution_str == "regex":  # catastrophic backtracking: stuck inside C, deaf to signals
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
'''


@pytest.fixture(scope="module")
def echo_spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "echo_reward.py"
    path.write_text(ECHO_REWARD)
    return f"{path}:echo"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(2) as p:
        yield p


def _run(spec, solutions, **kw):
    n = len(solutions)
    infos = [{"i": i} for i in range(n)]
    return score_batch(["custom"] * n, solutions, [None] * n, infos, custom_fn=spec, **kw)


def test_builtin_rewards_by_data_source(pool):
    result = score_batch(
        ["openai/gsm8k", "gsm8k", "lighteval/MATH", "HuggingFaceH4/MATH-500", "aime2024", "math"],
        ["#### 72", "#### 5", r"\boxed{\frac{1}{2}}", "no box", "so\nAnswer: 7", "no answer"],
        ["72", "6", "0.5", "1", "7", "1"],
        pool=pool,
    )  # verl routes "math" and every "aime*" to DAPO's reward: -1 when wrong
    assert result.scores == [1.0, 0.0, 1.0, 0.0, 1.0, -1.0]
    assert result.extra["acc"] == [1.0, 0.0, 1.0, 0.0, True, False]
    assert result.extra["pred"] == ["72", "5", r"\frac{1}{2}", None, "7", "[INVALID]"]
    assert (result.num_errors, result.num_timeouts) == (0, 0)


def test_boundary_errors_raise_before_scoring():
    with pytest.raises(ValueError, match="unknown reward data_source 'gsm8kk'. Did you mean 'gsm8k'"):
        score_batch(["gsm8kk"], ["#### 1"], ["1"])
    with pytest.raises(ValueError, match="ground_truths has 1 entries but solutions has 2"):
        score_batch(["gsm8k", "gsm8k"], ["a", "b"], ["1"])
    with pytest.raises(ValueError, match="custom_fn must be callable"):
        score_batch(["x"], ["a"], ["1"], custom_fn=42)
    with pytest.raises(ValueError, match="cannot be sent to a reward worker"):
        score_batch(["x"], ["a"], ["1"], custom_fn=lambda *a: 1.0, num_workers=1)
    with pytest.raises(ValueError, match="does not exist"):
        score_batch(["x"], ["a"], ["1"], custom_fn="missing_file.py:fn")


def test_in_process_scoring_accepts_any_callable():
    result = score_batch(["x", "y"], ["ab", "abcd"], [None, None], custom_fn=lambda d, s, g, e: len(s),
                         num_workers=0)
    assert result.scores == [2.0, 4.0]


@pytest.mark.parametrize("where", ["in_process", "pool"])
def test_errors_score_zero_and_are_counted(echo_spec, pool, where, caplog):
    solutions = ["0.5", "raise", "no-score", "nan", "text", "0.25"]
    kw = {"num_workers": 0} if where == "in_process" else {"pool": pool}
    result = _run(echo_spec, solutions, **kw)
    assert result.scores == [0.5, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert result.extra == {"idx": [0, None, None, None, None, 5]}
    assert (result.num_errors, result.num_timeouts) == (4, 0)
    assert "4 of 6 calls failed" in caplog.text and "RuntimeError: boom" in caplog.text


def test_hung_calls_are_killed_and_the_rest_still_scored(echo_spec, pool):
    solutions = ["1", "sleep", "2", "regex", "3", "4"]  # one hang per worker: they time out together
    start = time.monotonic()
    result = _run(echo_spec, solutions, timeout_s=2.0, pool=pool)
    elapsed = time.monotonic() - start
    assert result.scores == [1.0, 0.0, 2.0, 0.0, 3.0, 4.0]
    assert result.extra["idx"] == [0, None, 2, None, 4, 5]
    assert (result.num_errors, result.num_timeouts) == (0, 2)
    assert elapsed < 20.0  # two 2 s deadlines (plus a loaded machine), not 60 s of sleep
    # The pool replaced the killed workers and keeps serving.
    assert _run(echo_spec, ["5", "6"], pool=pool).scores == [5.0, 6.0]


def test_dead_worker_is_an_error_and_is_replaced(echo_spec, pool):
    result = _run(echo_spec, ["1", "die", "2", "3"], pool=pool)
    assert result.scores == [1.0, 0.0, 2.0, 3.0]
    assert (result.num_errors, result.num_timeouts) == (1, 0)


def test_shared_pool_and_custom_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def length_reward(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return len(solution_str) / 10\n")
    spec = f"{path}:length_reward"
    result = score_batch(["a", "b"], ["abc", "abcdefghij"], [None, None], custom_fn=spec, num_workers=1)
    assert result.scores == [0.3, 1.0]


def test_function_not_importable_in_workers(monkeypatch):
    # A module that exists only in this process (like one built at run time): its functions pickle here by
    # name, but a worker process cannot import them.
    module = types.ModuleType("reward_module_only_in_this_process")
    exec("def reward(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with RewardPool(1) as own_pool, pytest.raises(ValueError, match="reward worker cannot load the reward function"):
        score_batch(["a"], ["x"], [None], custom_fn=module.reward, pool=own_pool)


def test_empty_batch():
    result = score_batch([], [], [], num_workers=1)
    assert (result.scores, result.extra, result.num_errors, result.num_timeouts) == ([], {}, 0, 0)


def test_many_rows_keep_their_order(echo_spec, pool):
    n = 300
    result = _run(echo_spec, [str(i) for i in range(n)], pool=pool)
    assert result.scores == [float(i) for i in range(n)]
    assert result.extra["idx"] == list(range(n))


def test_worker_that_cannot_start_raises(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits at once, never reports ready
    with RewardPool(1) as own_pool, pytest.raises(RuntimeError, match="reward worker failed to start"):
        score_batch(["gsm8k"], ["#### 1"], ["1"], pool=own_pool)


def test_worker_killed_between_batches_is_restarted():
    with RewardPool(1) as own_pool:
        assert score_batch(["gsm8k"], ["#### 1"], ["1"], pool=own_pool).scores == [1.0]
        own_pool._workers[0].proc.kill()
        own_pool._workers[0].proc.wait()
        assert score_batch(["gsm8k"], ["#### 2"], ["1"], pool=own_pool).scores == [0.0]
        assert own_pool._workers[0].proc.poll() is None
