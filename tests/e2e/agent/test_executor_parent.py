"""Tool sandboxes die with their parent: a driver process running two python-tool calls is killed with
SIGKILL, and both sandbox processes end within 5 s."""
import os
import signal
import subprocess
import sys
import textwrap

from tests.support.paths import ROOT
from tests.support.reliability import alive, wait_for

DRIVER = textwrap.dedent('''
    import sys, threading
    sys.path.insert(0, sys.argv[1])
    from rlhf_mcore.agent.executor import ToolExecutor
    from rlhf_mcore.agent.parsers import ToolCall
    from rlhf_mcore.agent.tools import load_tools
    ex = ToolExecutor(load_tools(["python"], None), timeout_s=300, max_output_chars=100, memory_mb=512, workers=2)
    print("running", flush=True)
    ex.run([ToolCall("python", {"code": "import time\\ntime.sleep(300)"})] * 2)
''')


def sandbox_children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found


def test_sandboxes_die_with_a_killed_parent(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        kids = wait_for(lambda: len(sandbox_children(proc.pid)) == 2 and sandbox_children(proc.pid), 20.0)
        assert kids and len(kids) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_for(lambda: not any(alive(k) for k in kids), 5.0), "a sandbox outlived its parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
