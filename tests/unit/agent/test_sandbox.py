"""The python tool's sandbox under hostile code: every case returns a result of the right kind within its
limits (time-out, memory, exception, os._exit, fork, subprocess, output flood, writes outside its
directory, network, signals to the trainer), and nothing it starts outlives it."""
from __future__ import annotations

import socket
import time

import pytest

from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.launch import SandboxLimits, run_sandboxed
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import load_tools

TIMEOUT_S = 2.0
PYTHON = "rlhf_mcore.agent.python_tool:run_python"


@pytest.fixture(scope="module")
def ex():
    with ToolExecutor(load_tools(["python"], None), timeout_s=TIMEOUT_S, max_output_chars=500, memory_mb=512,
                      workers=2) as executor:
        yield executor


def run(ex, code: str):
    return ex.run([ToolCall("python", {"code": code})])[0]


def layers() -> list[str]:
    return run_sandboxed(PYTHON, "python", {"code": "pass"}, {}, SandboxLimits(timeout_s=5)).layers


def test_prints_are_the_result_and_cwd_is_a_fresh_removed_dir(ex):
    r = run(ex, "import os\nopen('a.txt', 'w').write('hello')\nprint(open('a.txt').read(), os.getcwd())\n6 * 7")
    assert r.error is None and not r.timed_out
    text, cwd = r.text.split()
    assert text == "hello" and "rlhf-tool-" in cwd  # the last expression (42) is not printed
    import os
    assert not os.path.exists(cwd)


def test_infinite_loop_times_out_within_timeout_plus_one_second(ex):
    r = run(ex, "while True:\n    pass")
    assert r.error == "timeout" and r.timed_out
    assert TIMEOUT_S <= r.seconds < TIMEOUT_S + 1.0
    assert "time-out of 2 s" in r.text


def test_memory_limit_refuses_2gb(ex):
    r = run(ex, "x = bytearray(2 * 1024 ** 3)\nprint('allocated')")
    assert r.error in ("exception", "crash") and "allocated" not in r.text
    assert r.text.splitlines()[-1] == "MemoryError"
    assert r.seconds < TIMEOUT_S


def test_exception_gives_the_traceback_last_line(ex):
    r = run(ex, "def f(x):\n    return 1 / x\nf(0)")
    assert r.error == "exception"
    lines = r.text.splitlines()
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert lines[0] == "Traceback (most recent call last):" and 'File "<code>", line 2, in f' in r.text
    assert "rlhf_mcore" not in r.text  # the sandbox's own frames are cut


def test_os_exit_is_a_crash(ex):
    r = run(ex, "import os\nprint('before', flush=True)\nos._exit(3)")
    assert r.error == "crash" and "code 3" in r.text and r.text.startswith("before")


@pytest.mark.parametrize("code", ["import os\nos.fork()", "import subprocess\nsubprocess.run(['true'])",
                                  "import os\nos.system('true')", "import multiprocessing as mp\n"
                                  "p = mp.Process(target=print)\np.start()\np.join()"])
def test_starting_a_process_is_refused(ex, code):
    r = run(ex, code)
    assert r.error == "exception" and "PermissionError" in r.text.splitlines()[-1]


def test_fork_through_ctypes_is_refused_by_seccomp(ex):
    if "seccomp" not in layers():
        pytest.skip("seccomp filter not available on this kernel/arch")
    r = run(ex, "import ctypes, os\nprint(ctypes.CDLL(None, use_errno=True).fork(), ctypes.get_errno())")
    assert r.error is None and r.text.split() == ["-1", "1"]  # fork() = -1, errno EPERM


def test_output_flood_is_cut_and_stopped_before_the_timeout():
    with ToolExecutor(load_tools(["python"], None), timeout_s=10.0, max_output_chars=300, memory_mb=512,
                      workers=1) as executor:
        start = time.monotonic()
        r = executor.run([ToolCall("python", {"code": "i = 0\nwhile True:\n    print(i, 'x' * 50)\n    i += 1"})])[0]
    assert time.monotonic() - start < 5.0 and not r.timed_out
    assert r.error is None and r.truncated
    assert r.text.startswith("0 xxx") and "characters cut" in r.text
    assert len(r.text) < 300 + 100


def test_finite_output_keeps_its_head_and_tail(ex):
    r = run(ex, "for i in range(2000):\n    print(i)\nraise KeyError('last')")
    assert r.error == "exception" and r.truncated
    assert r.text.startswith("0\n1\n") and r.text.splitlines()[-1] == "KeyError: 'last'"


@pytest.mark.parametrize("how", ["open({p!r}, 'w').write('x')", "import pathlib\npathlib.Path({p!r}).write_text('x')",
                                 "import os\nos.close(os.open({p!r}, os.O_CREAT | os.O_WRONLY))"])
def test_writing_outside_its_directory_is_refused(ex, tmp_path, how):
    target = tmp_path / "escaped.txt"
    r = run(ex, how.format(p=str(target)))
    assert r.error == "exception" and "PermissionError" in r.text.splitlines()[-1]
    assert not target.exists()


def test_writes_bypassing_open_are_refused_by_landlock(ex, tmp_path):
    if "landlock" not in layers():
        pytest.skip("Landlock not available on this kernel")
    target, victim = tmp_path / "escaped.txt", tmp_path / "victim.txt"
    victim.write_text("keep")
    code = (f"import _io, posix\ntry:\n    _io.FileIO({str(target)!r}, 'w')\nexcept OSError as e:\n"
            f"    print(e.errno)\nposix.unlink({str(victim)!r})")
    r = run(ex, code)
    # EACCES where Landlock refuses it; ENOENT where the private root does not even hold the path
    assert r.error == "exception" and r.text.splitlines()[0] in ("13", "2")
    assert not target.exists() and victim.read_text() == "keep"


def test_network_is_refused(ex):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                     f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))"):
            r = run(ex, code)
            assert r.error == "exception" and "PermissionError" in r.text.splitlines()[-1], r.text
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    finally:
        server.close()


def test_signals_to_the_trainer_are_refused(ex):
    if "seccomp" not in layers():
        pytest.skip("seccomp filter not available on this kernel/arch")
    r = run(ex, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert r.error == "exception" and r.text.splitlines()[-1] == "PermissionError: [Errno 1] Operation not permitted"


def test_big_file_write_is_bounded(tmp_path):
    limits = SandboxLimits(timeout_s=5, file_mb=1)
    done = run_sandboxed(PYTHON, "python", {"code": "open('big', 'wb').write(b'x' * (4 << 20))"}, {}, limits)
    assert done.status == "exception" and done.error == "OSError: [Errno 27] File too large"
