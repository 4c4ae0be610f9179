"""Run one sandboxed tool call from the trainer's side: start the sandbox process, read its output under a
wall-clock deadline, kill its whole process group when time is up, and classify how it ended.

The process is a fresh ``python -I -B -u`` (never a fork of the trainer), in its own session (so
``killpg`` reaches anything it left), in a fresh temporary directory that is removed afterwards, with a
minimal environment (HOME and TMPDIR in that directory, proxies pointing nowhere, one BLAS thread).
stdout and stderr share one pipe, read as the code writes. Longer output than ``max_output_chars`` keeps
its first and last halves around a marker (an error is usually at the end), and a process that writes more
than `flood_bytes` is stopped at once instead of at its time-out.
"""
from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

_BOOT = ("import sys, json; spec = json.loads(sys.stdin.readline()); sys.path[:0] = spec['sys_path']; "
         "from rlhf_mcore.agent.sandbox import main; main(spec)")
_NOWHERE = "http://127.0.0.1:9"


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock, from the process start
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    max_output_chars: int = 4096
    file_mb: int = 64  # largest file it may write (RLIMIT_FSIZE)

    def flood_bytes(self) -> int:
        return max(1 << 20, 64 * self.max_output_chars)


@dataclass(slots=True)
class Finished:
    status: str  # "ok" | "exception" | "timeout" | "crash"
    output: str  # what it printed (cut to max_output_chars)
    value: str = ""  # the tool function's return value (ok)
    error: str = ""  # exception: the traceback's last line; crash: how it died
    truncated: bool = False
    flooded: bool = False  # stopped for writing more than flood_bytes
    seconds: float = 0.0
    layers: list[str] = field(default_factory=list)  # kernel-level layers that held (landlock, seccomp)


def run_sandboxed(origin: str, tool: str, arguments: dict, context: dict, limits: SandboxLimits) -> Finished:
    """Run ``tool``'s function (found through ``origin``) on ``arguments`` in a sandbox process."""
    workdir = tempfile.mkdtemp(prefix="rlhf-tool-")
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        spec = {"origin": origin, "tool": tool, "arguments": arguments, "context": context, "workdir": workdir,
                "status_fd": status_w, "parent_pid": os.getpid(), "sys_path": [p or os.getcwd() for p in sys.path],
                "limits": {"memory_mb": int(limits.memory_mb), "file_mb": int(limits.file_mb),
                           "cpu_s": math.ceil(limits.timeout_s) + 1}}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-u", "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=(status_w,), cwd=workdir, env=_env(workdir),
            start_new_session=True)
        os.close(status_w)
        status_w = -1
        try:
            proc.stdin.write((json.dumps(spec) + "\n").encode())
            proc.stdin.close()
        except OSError:  # it died at once: its exit status says why
            pass
        return _collect(proc, status_r, limits, start)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _env(workdir: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "no_proxy": ""}
    env.update({k: _NOWHERE for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")})
    return env


def _collect(proc: subprocess.Popen, status_r: int, limits: SandboxLimits, start: float) -> Finished:
    deadline = start + limits.timeout_s
    keep = 4 * limits.max_output_chars  # bytes: enough for max_output_chars characters of UTF-8
    head, tail, total, status = bytearray(), bytearray(), 0, bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(status_r, selectors.EVENT_READ, "status")
    timed_out = flooded = False
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "status":
                    status += chunk
                else:
                    head += chunk[: max(0, keep - len(head))]
                    tail = (tail + chunk)[-keep:]
                    total += len(chunk)
            if total > limits.flood_bytes():
                flooded = True
                break
    finally:
        sel.close()
        _kill_group(proc)
        proc.stdout.close()
    text, truncated = cut_output(bytes(head), bytes(tail), total, limits.max_output_chars)
    out = Finished("ok", text, truncated=truncated, flooded=flooded, seconds=time.monotonic() - start)
    return _classify(out, proc.returncode, bytes(status), timed_out, limits)


def cut_output(head: bytes, tail: bytes, total: int, max_chars: int) -> tuple[str, bool]:
    """The output as text of at most ``max_chars`` characters (plus a marker): its first and last halves
    when longer. ``head``/``tail``: its first and last bytes; ``total``: its length in bytes.

    >>> cut_output(b"abcdefghij", b"abcdefghij", 10, 4)
    ('ab\\n[... 6 characters cut: the output is limited to 4 ...]\\nij', True)
    """
    if total <= len(head):
        text = head.decode("utf-8", errors="replace")
        if len(text) <= max_chars:
            return text, False
        first, last, num_chars = text[: max_chars // 2], text[len(text) - (max_chars - max_chars // 2):], len(text)
    else:
        first = head.decode("utf-8", errors="replace")[: max_chars // 2]
        last = tail.decode("utf-8", errors="replace")
        last = last[len(last) - (max_chars - max_chars // 2):]
        num_chars = total  # bytes: a lower bound on what was never kept
    cut = num_chars - len(first) - len(last)
    return f"{first}\n[... {cut} characters cut: the output is limited to {max_chars} ...]\n{last}", True


def _classify(out: Finished, returncode: int, status: bytes, timed_out: bool, limits: SandboxLimits) -> Finished:
    if timed_out:
        out.status, out.error = "timeout", f"the call exceeded its time-out of {limits.timeout_s:g} s"
        return out
    try:
        report = json.loads(status.decode()) if status else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        report = None
    if out.flooded and report is None:
        out.status = "ok"  # stopped for its output: what it printed is the result
        return out
    if not isinstance(report, dict) or report.get("status") not in ("ok", "exception"):
        out.status, out.error = "crash", _death(returncode, limits)
        return out
    out.status, out.layers = report["status"], list(report.get("layers", []))
    out.value, out.error = str(report.get("value", "")), str(report.get("error", ""))
    return out


def _death(returncode: int, limits: SandboxLimits) -> str:
    if returncode is None or returncode >= 0:
        return f"the tool process exited with code {returncode} before returning a result"
    sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
    hint = {"SIGXCPU": f" (CPU time limit of {math.ceil(limits.timeout_s) + 1} s)",
            "SIGKILL": f" (memory limit of {limits.memory_mb} MB?)",
            "SIGSEGV": f" (memory limit of {limits.memory_mb} MB?)",
            "SIGABRT": f" (memory limit of {limits.memory_mb} MB?)"}.get(sig, "")
    return f"the tool process was killed by {sig}{hint}"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's session (it and anything it started) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
