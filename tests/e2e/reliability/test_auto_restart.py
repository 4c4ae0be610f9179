"""Two ranks under torchrun (gloo, CPU), launched as users do (launch/torchrun.sh: --max-restarts, resume=auto):
a rank killed with -9 at a random moment after the first checkpoint makes torchrun restart the job, which
resumes from the newest intact checkpoint and ends with metrics equal, bitwise, to an uninterrupted run's. A
SIGTERM that reaches one rank only stops both at the same step (exit 7 each) with that step saved; SIGTERM to
torchrun (Slurm's preemption) reaches every rank, which save and stop without a restart. The random moment and
rank are printed with their seed (KILL_SEED=... replays them)."""
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from rlhf_mcore.checkpoint import list_checkpoints
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from tests.launch import worker_cmd
from tests.support.ports import free_port
from tests.support.reliability import (
    ROOT,
    TIMING_KEYS,
    TINY,
    children,
    env,
    metrics,
    overrides_for,
    start,
    wait_for,
)

pytestmark = pytest.mark.dist
TWO_RANKS = ("data.train_batch_size=2", "actor.ppo_mini_batch_size=1", "rollout.max_response_length=8",
             "data.val_files=", "trainer.total_steps=6", "trainer.save_freq=1", "trainer.max_checkpoints_to_keep=2")


def comparable(rows: list[dict]) -> dict:
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(TIMING_KEYS)} for m in rows}


def launch(tmp_path, log_name: str, max_restarts: int) -> subprocess.Popen:
    """launch/torchrun.sh with 2 CPU ranks."""
    environ = {**env(), "NPROC": "2", "PYTHON": sys.executable, "MAX_RESTARTS": str(max_restarts),
               "LOG_DIR": str(tmp_path / "torchrun_logs")}
    cmd = ["bash", str(ROOT / "launch" / "torchrun.sh"), TINY, *overrides_for(tmp_path, *TWO_RANKS)]
    return start(cmd, tmp_path / log_name, environ)


def finish(proc: subprocess.Popen, timeout_s: float = 600) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        for pid in [proc.pid, *children(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    rc = finish(launch(out, "torchrun.log", max_restarts=0))
    assert rc == 0, (out / "torchrun.log").read_text()[-4000:]
    return comparable(metrics(out / "run"))


def metrics_lines(run_dir) -> list[str]:
    path = run_dir / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def rank_pids(launcher: int) -> list[int]:
    return [p for p in children(launcher) if "rlhf_mcore.train" in open(f"/proc/{p}/cmdline").read()]


def test_a_rank_killed_at_a_random_moment_restarts_and_ends_like_the_straight_run(tmp_path, straight):
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    delay, victim = rng.uniform(0.0, 3.0), rng.randrange(2)
    run_dir, log = tmp_path / "run", tmp_path / "torchrun.log"
    proc = launch(tmp_path, "torchrun.log", max_restarts=3)
    assert wait_checkpoint(run_dir, proc), log.read_text()[-4000:]
    # the random moment is cut short when only two of the six steps are left: a fast machine ran the rest of the
    # job inside the delay, and a job that has ended cannot be killed
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and len(metrics_lines(run_dir)) < 4:
        time.sleep(0.02)
    pids = rank_pids(proc.pid)
    assert len(pids) == 2 and proc.poll() is None, "the job ended before the kill"
    steps_before = len(metrics(run_dir))
    os.kill(pids[victim], signal.SIGKILL)
    killed_at = time.monotonic()
    rc = finish(proc)
    out = log.read_text()
    print(f"KILL_SEED={seed}: rank {victim} killed -9 {delay:.2f}s after global_step_1 (at metrics line "
          f"{steps_before}); the job ended rc={rc} {time.monotonic() - killed_at:.1f}s later")
    assert rc == 0, out[-4000:]
    # killed, restarted, resumed: torchrun names the first rank it finds dead, the one killed -9 or its peer that
    # the agent stopped with SIGTERM (-15) meanwhile (KILL_SEED=281557 on 2026-12-04)
    assert re.search(r"failed \(exitcode: -(9|15)\)", out) and "resumed from" in out, out[-4000:]
    assert comparable(metrics(run_dir)) == straight  # every step once, every value bitwise
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))


def test_sigterm_to_one_rank_stops_both_at_the_same_step_with_it_saved(tmp_path, straight):
    """Plain processes (no torchrun to pass the signal on): rank 1 alone gets SIGTERM mid-update of step 3; both
    ranks exit 7 after saving step 3; the job relaunched (resume=auto) ends like the straight run."""
    run_dir, port = tmp_path / "run", free_port()
    cmd = worker_cmd("signal_fault", "--config", TINY, *overrides_for(tmp_path, *TWO_RANKS))
    marks = {"SIGNAL_AT": "rlhf_mcore.trainer.phases:optimizer_step:5", "SIGNAL_RANK": "1",
             "OMP_NUM_THREADS": "1"}  # as torchrun sets it: the same float reduction order as the straight run
    procs = [start(cmd, tmp_path / f"rank{r}.log", {**env(r, 2, port), **marks}) for r in (0, 1)]
    codes = [finish(p) for p in procs]
    outs = [(tmp_path / f"rank{r}.log").read_text() for r in (0, 1)]
    assert codes == [7, 7], (codes, outs[0][-3000:], outs[1][-3000:])
    assert "rank 1: received SIGTERM: finishing this step" in outs[1] and "received SIGTERM" not in outs[0]
    assert "run stopped:\n  - stopped at step 3 by SIGTERM (received by rank 1): saved and verified " \
           f"{run_dir / 'global_step_3'}" in outs[0], outs[0][-3000:]
    assert [s for s, _ in list_checkpoints(run_dir)] == [1, 2, 3]  # keep=2, + the newest until a step confirms it
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
    assert (run_dir / "run.lock").read_text() == ""
    rc = finish(launch(tmp_path, "resume.log", max_restarts=0))
    out = (tmp_path / "resume.log").read_text()
    assert rc == 0 and f"resumed from {run_dir / 'global_step_3'} at step 3" in out, out[-4000:]
    assert comparable(metrics(run_dir)) == straight


def test_sigterm_to_torchrun_reaches_every_rank_which_save_and_stop_without_a_restart(tmp_path, straight):
    """Slurm's preemption path: torchrun gets SIGTERM and passes it on to every rank (and their helper processes:
    the whole process group); the ranks finish the step, save it, and torchrun ends without restarting."""
    run_dir, log = tmp_path / "run", tmp_path / "torchrun.log"
    proc = launch(tmp_path, "torchrun.log", max_restarts=3)
    assert wait_for(lambda: "step 2/6" in log.read_text() or proc.poll() is not None, 300), log.read_text()[-4000:]
    proc.send_signal(signal.SIGTERM)
    rc = finish(proc)
    out = log.read_text()
    stopped = [line for line in out.splitlines() if line.startswith("  - stopped at step ")]
    assert rc != 0 and len(stopped) == 1 and "saved and verified" in stopped[0], out[-4000:]
    step = int(stopped[0].split()[4])
    print(f"SIGTERM to torchrun after 'step 2/6': stopped at step {step}, rc={rc}")
    assert "resumed from" not in out and list_checkpoints(run_dir)[-1][0] == step
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
    assert finish(launch(tmp_path, "resume.log", max_restarts=0)) == 0
    assert f"resumed from {run_dir / f'global_step_{step}'}" in (tmp_path / "resume.log").read_text()
    assert comparable(metrics(run_dir)) == straight


def wait_checkpoint(run_dir, proc, timeout_s: float = 300) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "latest_checkpointed_iteration.txt").is_file():
            return True
        time.sleep(0.05)
    return False
