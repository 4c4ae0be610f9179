"""Faults inside megatron's forked checkpoint writers (issue 29), in a subprocess of its own process group:
Ctrl-C (SIGINT to the whole group) during a save, and a writer that dies (kill -9, the OOM killer). Asserted: no
hang, the documented exit code, one line, no process of the group left, every published checkpoint verifies and
`latest` names one of them."""
import os

import pytest

from rlhf_mcore.checkpoint import list_checkpoints
from rlhf_mcore.checkpoint.layout import LATEST_FILE
from rlhf_mcore.checkpoint.verify import checkpoint_problems
from rlhf_mcore.checkpoint.writers import EXIT_WRITER_DIED
from tests.launch import worker_cmd
from tests.support.ports import free_port
from tests.support.reliability import env, overrides_for, start, train_cmd, wait_for

SMALL = ("data.train_batch_size=2", "rollout.max_response_length=8", "data.val_files=", "trainer.save_freq=1",
         "trainer.total_steps=3")


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("fault, nth_save, code, line, saved", [
    ("sigint-group", 1, 7, "stopped at step 2 by SIGINT (received by rank 0): saved and verified", [1, 2]),
    ("die", 2, EXIT_WRITER_DIED, "died (killed by SIGKILL) while saving", [1]),
])
def test_writer_fault_never_hangs_and_leaves_no_process(tmp_path, fault, nth_save, code, line, saved):
    cmd = worker_cmd("writer_fault", *train_cmd(*overrides_for(tmp_path, *SMALL))[3:])
    log = tmp_path / "run.log"
    proc = start(cmd, log, {**env(0, 1, free_port()), "WRITER_FAULT": fault, "WRITER_FAULT_AT": str(nth_save),
                            "WRITER_FAULT_DIR": str(tmp_path)})
    try:
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    out = log.read_text()
    assert f"writer_fault_worker: {fault} in writer" in out, out[-3000:]
    assert rc == code and sum(line in x for x in out.splitlines()) == 1, out[-3000:]
    assert wait_for(lambda: group_gone(proc.pid), 10), "a process of the run outlived it"
    run_dir = tmp_path / "run"
    assert [s for s, _ in list_checkpoints(run_dir)] == saved
    assert all(checkpoint_problems(p) == [] for _, p in list_checkpoints(run_dir))
    assert int((run_dir / LATEST_FILE).read_text()) == saved[-1]
