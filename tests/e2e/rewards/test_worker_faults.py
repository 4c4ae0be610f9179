"""Reward workers under hostile reward code: garbage on the result pipe is a counted error (the pool goes on),
and processes a reward starts die with the pool, also when the trainer is killed -9."""
import textwrap
import time

from rlhf_mcore.rewards.workers import RewardPool
from tests.launch import cli
from tests.support.reliability import alive, wait_for

REWARDS = textwrap.dedent('''
    import os, re, struct, subprocess
    from multiprocessing.connection import Connection

    def _result_fd():
        code = open("/proc/self/cmdline", "rb").read().decode()
        return int(re.search(r"serve\\((\\d+), (\\d+)", code).group(2))

    def raw_garbage(data_source, solution_str, ground_truth, extra_info=None):
        os.write(_result_fd(), struct.pack("!i", 5) + b"\\x80xxxx")  # a length header, then no pickle
        return 1.0

    def wrong_message(data_source, solution_str, ground_truth, extra_info=None):
        Connection(os.dup(_result_fd()), readable=False).send("not a protocol message")
        return 1.0

    def spawn_sleeper(data_source, solution_str, ground_truth, extra_info=None):
        child = subprocess.Popen(["sleep", "300"])
        with open(ground_truth, "w") as f:
            f.write(str(child.pid))
        return 1.0

    def hang(data_source, solution_str, ground_truth, extra_info=None):
        import time
        time.sleep(300)

    def fine(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5
''')


def reward_file(tmp_path):
    path = tmp_path / "hostile.py"
    path.write_text(REWARDS)
    return str(path)


def test_garbage_on_the_result_pipe_is_a_counted_error(tmp_path):
    spec = reward_file(tmp_path)
    with RewardPool(1) as pool:
        for name in ("raw_garbage", "wrong_message"):
            tasks = [(f"{spec}:fine", "x", "s", "g", None), (f"{spec}:{name}", "x", "s", "g", None),
                     (f"{spec}:fine", "x", "s", "g", None)]
            out = pool.run(tasks, timeout_s=20)
            assert out[0][:2] == ("ok", 0.5) and out[2][:2] == ("ok", 0.5), out
            assert out[1][0] == "error" and "reward worker sent" in out[1][1], out


def test_a_process_a_reward_starts_dies_with_the_pool(tmp_path):
    spec, pid_file = reward_file(tmp_path), tmp_path / "pid"
    with RewardPool(1) as pool:
        assert pool.run([(f"{spec}:spawn_sleeper", "x", "s", str(pid_file), None)], timeout_s=20)[0][0] == "ok"
        sleeper = int(pid_file.read_text())
        assert alive(sleeper)
    assert wait_for(lambda: not alive(sleeper), timeout_s=10)


TRAINER = """import os, signal, sys
from rlhf_mcore.rewards.workers import RewardPool
pool = RewardPool(1)
print(pool.run([(sys.argv[1], "x", "s", sys.argv[2], None)], timeout_s=20)[0][0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_a_reward_starts_dies_with_a_killed_trainer(tmp_path):
    spec, pid_file = reward_file(tmp_path), tmp_path / "pid"
    done = cli("-c", TRAINER, f"{spec}:spawn_sleeper", pid_file, check=False, timeout=60)
    assert done.returncode == -9 and done.stdout.strip() == "ok", done.stderr
    sleeper = int(pid_file.read_text())
    assert wait_for(lambda: not alive(sleeper), timeout_s=10), "the reward's child outlived the trainer"


def test_a_hanging_batch_ends_at_its_budget_as_time_outs(tmp_path):
    """Each call under its own time-out would take 5 x 20 s; the batch budget (what a rank may take before the
    other ranks' collectives time out) ends it at 2 s, every unfinished call a counted time-out."""
    spec = reward_file(tmp_path)
    with RewardPool(1) as pool:
        start = time.monotonic()
        out = pool.run([(f"{spec}:fine", "x", "s", "g", None)] + [(f"{spec}:hang", "x", "s", "g", None)] * 4,
                       timeout_s=20, budget_s=2)
        assert time.monotonic() - start < 10
        assert out[0][:2] == ("ok", 0.5) and all(o[0] == "timeout" and "budget of 2 s" in o[1] for o in out[1:]), out
        assert pool.run([(f"{spec}:fine", "x", "s", "g", None)], timeout_s=20)[0][:2] == ("ok", 0.5)  # fresh worker
