"""One run per output directory: `run_dir/run.lock`, held (flock) by rank 0 for the whole run.

The file records who holds it (pid, host, start time). A second run on the directory is refused with that
record. The kernel drops the lock when its process dies (even by kill -9), so the lock of a dead run is taken
over, with a warning that names it. A clean exit empties the file (the lock stays, the record goes).

An attempt that torchrun restarted (`--max-restarts`, TORCHELASTIC_RESTART_COUNT > 0) waits up to
`RESTART_WAIT_S` for the lock: the killed attempt's forked children (megatron's checkpoint writers) share its
open lock file and hold the lock until they finish.

The same lock is also taken on a host-local file named after the directory's absolute path
(`<tmp>/rlhf_mcore-locks-<uid>/<sha256 of the path>.lock`), so that a live run whose directory was deleted (and
with it run.lock) still holds the path: a second run on it is refused, naming the live pid.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)
LOCK_FILE = "run.lock"
RESTART_WAIT_S = 60.0


class RunDirLocked(RuntimeError):
    """Another live process holds the output directory."""


def _describe(record: dict) -> str:
    return (f"pid {record.get('pid', '?')} on host {record.get('host', '?')}, "
            f"started {record.get('started_at', '?')}")


class RunLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self.host_path = host_lock_path(run_dir)
        self._fd: int | None = None
        self._host_fd: int | None = None

    def acquire(self, wait_s: float | None = None) -> RunLock:
        """Take the lock or raise RunDirLocked naming its holder; retry for `wait_s` seconds first (default:
        RESTART_WAIT_S in an attempt restarted by torchrun, else 0)."""
        if wait_s is None:
            wait_s = RESTART_WAIT_S if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0 else 0.0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        host_fd = _open_host_lock(self.host_path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        for held, where in ((host_fd, self.host_path), (fd, self.path)):
            try:
                if held is not None:
                    _flock_within(held, wait_s)
            except BlockingIOError:
                record = _read_record(held)
                for f in (host_fd, fd):
                    if f is not None:
                        os.close(f)
                raise RunDirLocked(
                    f"trainer.output_dir: {self.path.parent} is in use by another run ({_describe(record)}; lock file "
                    f"{where}). Wait for that run to end or stop it, or choose another trainer.output_dir.") from None
        previous = _read_record(fd)
        if previous:
            log.warning("%s: taking over the lock of a run that is gone (%s)", self.path, _describe(previous))
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for f in (fd, host_fd):
            if f is not None:
                os.ftruncate(f, 0)
                os.pwrite(f, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd, self._host_fd = fd, host_fd
        return self

    def release(self) -> None:
        """Empty the record and drop the lock (the file stays: unlinking it races with a waiting run)."""
        if self._fd is None:
            return
        for fd in (self._fd, self._host_fd):
            if fd is None:
                continue
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._fd = self._host_fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def host_lock_path(run_dir: str | os.PathLike) -> Path:
    """The host-local lock file of `run_dir` (per user, keyed by its absolute path)."""
    key = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"rlhf_mcore-locks-{os.getuid()}" / f"{key}.lock"


def _open_host_lock(path: Path) -> int | None:
    """The host-local lock file, opened; None where it cannot be (the run-dir lock still holds)."""
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        log.debug("%s: host-local lock unavailable (%s)", path, e)
        return None


def _flock_within(fd: int, wait_s: float, every_s: float = 0.5) -> None:
    """flock(LOCK_EX), retried every `every_s` for `wait_s` seconds; BlockingIOError once that has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(every_s)


def _read_record(fd: int) -> dict:
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return {}
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "started_at": f"unreadable record {text[:80]!r}"}
    return record if isinstance(record, dict) else {}
