"""No orphans: a rank whose launcher is killed during start-up dies, and processes the trainer forks
(megatron's checkpoint writers) or spawns (multiprocessing's spawn context) die with it when it is killed by pid,
and so does the resource tracker."""
import os
import subprocess
import sys

from tests.launch import cli_cmd
from tests.support.ports import free_port
from tests.support.reliability import ROOT, TINY, alive, wait_for

FORKER = """import multiprocessing as mp, os, signal, time
from multiprocessing import resource_tracker
from rlhf_mcore.lifetime import forked_children_die_with_us
forked_children_die_with_us()
resource_tracker.ensure_running()
child = mp.get_context("fork").Process(target=time.sleep, args=(300,))
child.start()
spawned = mp.get_context("spawn").Process(target=time.sleep, args=(300,))  # megatron's results-queue manager's way
spawned.start()
print(child.pid, spawned.pid, resource_tracker._resource_tracker._pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_forked_children_and_the_resource_tracker_die_with_a_killed_trainer():
    done = subprocess.run([sys.executable, "-c", FORKER], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    pids = list(map(int, done.stdout.split()))
    assert wait_for(lambda: not any(map(alive, pids)), timeout_s=15), dict(zip(("fork", "spawn", "tracker"),
                                                                            map(alive, pids)))


LAUNCHER = """import os, signal, subprocess, sys, time
os.environ["RLHF_MCORE_LAUNCHER_PID"] = str(os.getpid())  # as rlhf_mcore.launcher does
rank = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(rank.pid, flush=True)
time.sleep(float(os.environ["KILL_AFTER_S"]))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_dies_with_a_launcher_killed_during_start_up(tmp_path):
    """Rank 0 of 2 waits for a rank 1 that never comes; its launcher is killed meanwhile."""
    for kill_after_s in ("0.05", "0.3", "0.8", "4"):  # at once, in the imports, then waiting for the other rank
        environ = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHELASTIC_RUN_ID": "t", "RANK": "0", "LOCAL_RANK": "0",
                   "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()), "KILL_AFTER_S": kill_after_s}
        cmd = cli_cmd("rlhf_mcore.train", "--config", TINY, f"trainer.output_dir={tmp_path / 'run'}")
        done = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], cwd=ROOT, env=environ, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == -9, done.stderr
        rank = int(done.stdout.split()[0])
        assert wait_for(lambda: not alive(rank), timeout_s=20), f"rank {rank} outlived its launcher"
