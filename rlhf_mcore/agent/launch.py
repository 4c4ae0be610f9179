"""Run one sandboxed tool call from the trainer's side: start the sandbox process, read its output under a
wall-clock deadline, kill its whole process group when time is up, and classify how it ended.

The process is a fresh ``python -I -B -u`` (never a fork of the trainer), in its own session (so
``killpg`` reaches anything it left), in a fresh temporary directory that is removed afterwards whatever its
modes, with an environment built from nothing (HOME and TMPDIR in that directory, proxies pointing nowhere,
one BLAS thread): the trainer's variables (tokens, keys) never reach it. stdout and stderr share one pipe,
read as the code writes. Longer output than ``max_output_chars`` keeps its first and last halves around a
marker (an error is usually at the end; the marker counts towards the limit), and a process that writes
more than `flood_bytes` is stopped at once instead of at its time-out. The status pipe (the tool's return
value) is read under a cap too: a longer result is an error, never the trainer's memory.
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
    disk_mb: int = 64  # size of its working directory (a tmpfs, where the kernel allows namespaces)

    def flood_bytes(self) -> int:
        return max(1 << 20, 64 * self.max_output_chars)

    def status_bytes(self) -> int:
        """The most the status pipe may carry: the value (cut to max_output_chars by the sandbox) as JSON."""
        return 8 * self.max_output_chars + 4096


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
                           "cpu_s": math.ceil(limits.timeout_s) + 1, "disk_mb": int(limits.disk_mb),
                           "max_chars": int(limits.max_output_chars)}}
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
        remove_tree(workdir)


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
    timed_out = flooded = oversized = False
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
                    oversized = len(status) > limits.status_bytes()
                else:
                    head += chunk[: max(0, keep - len(head))]
                    tail = (tail + chunk)[-keep:]
                    total += len(chunk)
            if total > limits.flood_bytes():
                flooded = True
                break
            if oversized:
                break
    finally:
        sel.close()
        _kill_group(proc)
        proc.stdout.close()
    text, truncated = cut_output(bytes(head), bytes(tail), total, limits.max_output_chars)
    out = Finished("ok", text, truncated=truncated, flooded=flooded, seconds=time.monotonic() - start)
    if oversized:
        out.status = "crash"
        out.error = (f"the tool's result is longer than {limits.status_bytes()} bytes "
                     f"(rollout.multi_turn.max_tool_response_chars={limits.max_output_chars} bounds it)")
        return out
    return _classify(out, proc.returncode, bytes(status), timed_out, limits)


def _marker(cut: int, max_chars: int) -> str:
    return f"\n[... {cut} characters cut: the output is limited to {max_chars} ...]\n"


def cut_text(text: str, max_chars: int, total: int | None = None, tail: str | None = None) -> tuple[str, bool]:
    """`text` in at most ``max_chars`` characters, the marker included: its first and last parts around a
    marker when longer. ``total``/``tail``: the length and the end of a text of which `text` is only the
    start (an output read in part).

    >>> cut_text("0123456789" * 10, 80)
    ('0123456789\\n[... 79 characters cut: the output is limited to 80 ...]\\n90123456789', True)
    >>> cut_text("short", 60)
    ('short', False)
    """
    total = len(text) if total is None else total
    tail = text if tail is None else tail
    if total <= max_chars:
        return text, False
    keep = max_chars - len(_marker(total, max_chars))
    if keep < 2:
        return text[:max_chars], True
    first, last = text[: keep // 2], tail[len(tail) - (keep - keep // 2):]
    return f"{first}{_marker(total - len(first) - len(last), max_chars)}{last}", True


def cut_output(head: bytes, tail: bytes, total: int, max_chars: int) -> tuple[str, bool]:
    """The output as text of at most ``max_chars`` characters (the marker included). ``head``/``tail``:
    its first and last bytes; ``total``: its length in bytes (a lower bound on the characters never kept).

    >>> cut_output(b"abcdefghij", b"abcdefghij", 10, 4)
    ('abcd', True)
    """
    first = head.decode("utf-8", errors="replace")
    if total <= len(head):
        return cut_text(first, max_chars)
    return cut_text(first, max_chars, total, tail.decode("utf-8", errors="replace"))


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


def remove_tree(path: str) -> None:
    """Remove `path` and all in it, whatever modes the code left (a ``chmod 0`` directory, a read-only file)."""
    def allow_and_retry(func, failed, _exc):
        parent = os.path.dirname(failed)
        for where in (parent, failed):
            try:
                os.chmod(where, 0o700, follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass
        try:
            (remove_tree if os.path.isdir(failed) and not os.path.islink(failed) else os.unlink)(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=allow_and_retry)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's session (it and anything it started) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
