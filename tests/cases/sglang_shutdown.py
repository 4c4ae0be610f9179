"""A process that holds a named shared-memory block (so the multiprocessing resource tracker runs), starts an
engine stand-in with one child process, and shuts it down the way sglang.Engine does: SIGKILL every child of
this process (`kill_process_tree(os.getpid(), include_parent=False)`, which spares only `skip_pid`), plus the
same shutdown again at exit. Then it releases the block, as loky's and torch's semaphores are released at exit.

    python tests/cases/sglang_shutdown.py ours|sglang
      ours: through rlhf_mcore's SGLangRolloutEngine.shutdown; sglang: server.shutdown() straight.
Prints "scheduler stopped: True" and what the resource tracker says on stderr.
"""
import atexit
import os
import subprocess
import sys
import time
from multiprocessing import shared_memory

import psutil


def kill_process_tree(parent_pid, include_parent=True, skip_pid=None, wait_timeout=None):
    """sglang.srt.utils.kill_process_tree: SIGKILL every descendant of parent_pid except skip_pid."""
    children = [c for c in psutil.Process(parent_pid).children(recursive=True) if c.pid != skip_pid]
    for child in children:
        child.kill()
    psutil.wait_procs(children, timeout=wait_timeout)


class Engine:
    """What sglang.Engine does around its processes: a scheduler child, shutdown at exit too."""

    def __init__(self):
        self.scheduler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        atexit.register(self.shutdown)

    def shutdown(self):
        kill_process_tree(os.getpid(), include_parent=False, wait_timeout=60)


def main(mode: str) -> None:
    block = shared_memory.SharedMemory(create=True, size=64)  # starts the resource tracker, registers the name
    server = Engine()
    if mode == "ours":
        from types import SimpleNamespace

        from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine

        engine = SimpleNamespace(engine=server, stopped=False)
        SGLangRolloutEngine.shutdown(engine)
        SGLangRolloutEngine.shutdown(engine)  # a second call does nothing
    else:
        server.shutdown()
    print(f"scheduler stopped: {server.scheduler.wait(timeout=30) is not None}", flush=True)
    block.close()
    block.unlink()  # unregisters the name with the resource tracker
    time.sleep(1.0)  # the tracker reports on its own stderr: give it the time before this process exits


def entry(argv: list[str]) -> None:
    main(*argv)
