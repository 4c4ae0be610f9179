"""Megatron's checkpoint writers must not hang a save: `dist_checkpointing.save` forks one writer process per
bucket and waits for them in `count_queue.join()`, without a time-out. A writer that dies (the OOM killer, a
kill -9) never marks its task done, and the rank would wait forever while holding the run-directory lock.

`watch_writers(where)` polls this process's children during a save; a child that started during it and ended
with a non-zero status (read from /proc while it is a zombie, before anyone reaps it) ends the rank at once with
`EXIT_WRITER_DIED` and one line: the save is never published (its `global_step_N.tmp-*` directory is removed at
the next start), the previous checkpoint and `latest` are untouched, and every other helper process is killed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)
EXIT_WRITER_DIED = 1
POLL_S = 0.2


def _children() -> set[int]:
    pid, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def died_badly(pid: int) -> int | None:
    """The wait status of child `pid` when it is a zombie that did not exit 0; None otherwise (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])  # field 52 of proc(5): exit_code, as waitpid reports it
    return status or None


def describe_status(status: int) -> str:
    """A wait status in words.

    >>> describe_status(9), describe_status(256)
    ('killed by SIGKILL', 'exit code 1')
    """
    if status & 0x7F:
        return f"killed by {signal.Signals(status & 0x7F).name}"
    return f"exit code {status >> 8}"


def _abort(pid: int, status: int, where) -> None:
    import psutil

    print(f"checkpoint: writer process {pid} died ({describe_status(status)}) while saving {where}; the save can "
          f"never finish, so this rank exits now (code {EXIT_WRITER_DIED}). The previous checkpoint and `latest` are "
          "intact; resume with trainer.resume=auto.", file=sys.stderr, flush=True)
    for handler in logging.getLogger().handlers:
        handler.flush()
    for child in psutil.Process().children(recursive=True):  # the other writers, the results queue's manager
        with contextlib.suppress(psutil.Error):
            child.kill()
    os._exit(EXIT_WRITER_DIED)


@contextlib.contextmanager
def watch_writers(where):
    """While entered: a child process started meanwhile that dies with a non-zero status ends this process."""
    if not Path("/proc/self/stat").exists():
        yield
        return
    before, done = _children(), threading.Event()

    def watch():
        while not done.wait(POLL_S):
            for pid in _children() - before:
                status = died_badly(pid)
                if status:
                    _abort(pid, status, where)

    thread = threading.Thread(target=watch, name="checkpoint-writers", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
