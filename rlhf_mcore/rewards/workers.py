"""A persistent pool of reward processes in which every call runs under its own deadline.

A reward is user code: it can raise, loop forever or hang inside a C regex, where no signal or thread can
stop it. So calls run in worker processes, and a worker that reports nothing for ``timeout_s`` is killed
(SIGKILL): its current call becomes a time-out and a fresh worker takes over the rest of its share.
A worker that dies (segfault, ``os._exit``) turns its current call into an error the same way.

Workers are fresh interpreters (``python -c``) that import only ``rlhf_mcore.rewards``: never a fork of the
trainer, which is large (a fork copies its page tables: ~70 ms per GiB measured here), multi-threaded and
holds CUDA state, and never a re-import of the trainer's main module (as multiprocessing's spawn and
forkserver do). They persist across batches, so a batch costs only pickling its tasks and results; they
report "ready" once started, and the first deadline counts from then. On Linux a worker is killed when the
process that started it dies, even in the middle of a hung call.

A task is ``(fn, data_source, solution, ground_truth, extra_info)``. ``fn`` travels by reference: a
module-level function (pickled by module and name) or a ``"path/to/file.py:function"`` string that the
worker loads itself. Outcomes are ``("ok", score, extra)``, ``("error", message)`` or ``("timeout", message)``.

>>> from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score
>>> with RewardPool(1) as pool:
...     pool.run([(compute_gsm8k_score, "gsm8k", "so #### 3", "3", None)], timeout_s=5.0)
[('ok', 1.0, {'acc': 1.0, 'pred': '3'})]
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Sequence

from rlhf_mcore.lifetime import die_with_parent
from rlhf_mcore.rewards.custom import load_custom_reward
from rlhf_mcore.rewards.dispatch import call_reward

Outcome = tuple
Task = tuple
_READY = "ready"
_FATAL = "fatal"
_START_GRACE_S = 60.0  # how long a new worker may take to report ready before it counts as hung


def split_shards(num_items: int, num_shards: int) -> list[list[int]]:
    """Contiguous, balanced shards of ``range(num_items)``; empty shards are left out.

    >>> split_shards(5, 2)
    [[0, 1, 2], [3, 4]]
    """
    base, rem = divmod(num_items, num_shards)
    shards, start = [], 0
    for k in range(num_shards):
        size = base + (k < rem)
        if size:
            shards.append(list(range(start, start + size)))
        start += size
    return shards


def run_task(task: Task, loaded: dict[str, Any]) -> Outcome:
    """One task's outcome; ``"file.py:fn"`` specs are loaded once into ``loaded``. Never raises."""
    fn, *args = task
    if isinstance(fn, str):
        try:
            if fn not in loaded:
                loaded[fn] = load_custom_reward(fn)
            fn = loaded[fn]
        except Exception as err:
            return ("error", f"{type(err).__name__}: {err}")
    return call_reward(fn, *args)


def _worker_main(inbox: Connection, outbox: Connection) -> None:
    outbox.send(_READY)
    loaded: dict[str, Any] = {}
    while True:
        try:
            msg = inbox.recv()
        except EOFError:
            return
        except Exception as err:  # a task whose function cannot be imported in this process
            outbox.send((_FATAL, f"{type(err).__name__}: {err}"))
            return
        if msg is None:
            return
        for i, task in msg:
            outbox.send((i, run_task(task, loaded)))


def serve(read_fd: int, write_fd: int, parent_pid: int, life_fd: int = -1) -> None:
    """Entry point of a worker process (see ``RewardPool._start``)."""
    _exit_with_parent(parent_pid)
    if life_fd >= 0:
        _watch_group(life_fd, (read_fd, write_fd))
    _worker_main(Connection(read_fd, writable=False), Connection(write_fd, readable=False))


def _watch_group(life_fd: int, other_fds: tuple[int, ...]) -> None:
    """Fork a watchdog (before any reward code runs) that kills this worker's whole process group, the
    processes a reward started included, once `life_fd` reads EOF: the pool closed its end, or the trainer
    died. The kernel kills the worker itself with the trainer (prctl), but not the worker's children."""
    import signal

    if os.fork() == 0:
        try:
            for fd in other_fds:  # the pool sees EOF on the result pipe when the worker dies, not the watchdog
                os.close(fd)
            while os.read(life_fd, 1):
                pass
        finally:
            os.killpg(0, signal.SIGKILL)
            os._exit(0)
    os.close(life_fd)


def _exit_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (a hung call cannot check itself); off Linux
    workers still exit on EOF once their current call returns."""
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the signal was set
        os._exit(1)


@dataclass(slots=True, eq=False)
class _Worker:
    proc: subprocess.Popen
    inbox: Connection  # messages from the worker
    outbox: Connection  # tasks to the worker
    lifeline: int = -1  # closing it makes the worker's watchdog kill its process group
    garbage: str = ""  # set when the worker sent a message outside the protocol
    ready: bool = False
    indices: list[int] = field(default_factory=list)  # tasks of the current batch
    pos: int = 0  # indices[pos] is the task being computed now
    deadline: float = 0.0

    def stop(self) -> None:
        if self.lifeline >= 0:
            os.close(self.lifeline)
            self.lifeline = -1
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker's session: it and whatever it started
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.inbox.close()
        self.outbox.close()


def _is_message(msg: Any, worker: _Worker) -> bool:
    """A (fatal, text) message, or (index of the call being computed, outcome tuple)."""
    if not isinstance(msg, tuple) or len(msg) != 2:
        return False
    if msg[0] == _FATAL:
        return isinstance(msg[1], str)
    current = worker.indices[worker.pos] if worker.pos < len(worker.indices) else None
    return msg[0] == current and isinstance(msg[1], tuple) and bool(msg[1]) and msg[1][0] in ("ok", "error", "timeout")


def _child_env() -> dict[str, str]:
    """This process's environment with its sys.path, so workers import what the caller can."""
    paths = [p or os.getcwd() for p in sys.path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class RewardPool:
    """``num_workers`` persistent reward processes (started on first use; ``close()`` ends them)."""

    def __init__(self, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"reward pool needs num_workers >= 1 (got {num_workers})")
        self.num_workers = num_workers
        self._workers: list[_Worker] = []

    def run(self, tasks: Sequence[Task], timeout_s: float, budget_s: float | None = None) -> list[Outcome]:
        """Outcomes of ``tasks`` in order; a failing or hung call never raises here. ``budget_s``: once the
        whole batch has taken this long, every unfinished call is a time-out (and its worker is replaced), so
        a rank whose rewards hang reports it before the other ranks' collectives time out."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive (got {timeout_s})")
        self._workers = [w if w.proc.poll() is None else self._restart(w) for w in self._workers]
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start())
        results: list = [None] * len(tasks)
        busy = []
        for worker, shard in zip(self._workers, split_shards(len(tasks), self.num_workers)):
            self._assign(worker, shard, tasks, timeout_s)
            busy.append(worker)
        end = None if budget_s is None else time.monotonic() + budget_s
        try:
            while busy and (end is None or time.monotonic() < end):
                busy = self._step(busy, results, tasks, timeout_s, end)
            if busy:
                self._expire(busy, results, budget_s)
        except BaseException:  # an interrupt or a fatal worker error: no half-used workers survive
            self.close()
            raise
        return results

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> _Worker:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        life_r, life_w = os.pipe()
        code = f"from rlhf_mcore.rewards.workers import serve; serve({task_r}, {result_w}, {os.getpid()}, {life_r})"
        proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(task_r, result_w, life_r), env=_child_env(),
            stdin=subprocess.DEVNULL, start_new_session=True,  # its own process group: stop() kills all of it
        )
        for fd in (task_r, result_w, life_r):  # the worker holds the only other ends: EOF then means it is gone
            os.close(fd)
        return _Worker(proc, Connection(result_r, writable=False), Connection(task_w, readable=False), life_w)

    def _restart(self, worker: _Worker) -> _Worker:
        worker.stop()
        return self._start()

    def _assign(self, worker: _Worker, indices: list[int], tasks: Sequence[Task], timeout_s: float) -> None:
        worker.indices, worker.pos = indices, 0
        worker.deadline = time.monotonic() + timeout_s + (0.0 if worker.ready else _START_GRACE_S)
        try:
            worker.outbox.send([(i, tasks[i]) for i in indices])
        except OSError:  # the worker died (BrokenPipeError): _step sees its EOF and replaces it
            pass

    def _expire(self, busy: list[_Worker], results: list, budget_s: float) -> None:
        """The batch ran out of time: its unfinished calls are time-outs; their workers restart on the next run."""
        for worker in busy:
            worker.stop()
        failed = ("timeout", f"reward batch exceeded its budget of {budget_s:g} s (the other ranks would time out "
                             "waiting); this call did not finish")
        for i, outcome in enumerate(results):
            if outcome is None:
                results[i] = failed

    def _step(self, busy: list[_Worker], results: list, tasks: Sequence[Task], timeout_s: float,
              end: float | None = None) -> list[_Worker]:
        """Wait for the next message or deadline; return the workers still busy afterwards."""
        soonest = min([w.deadline for w in busy] + ([end] if end is not None else []))
        wait([w.inbox for w in busy], timeout=max(0.0, soonest - time.monotonic()))
        still_busy = []
        for worker in busy:
            alive = self._drain(worker, results, timeout_s)
            if worker.pos == len(worker.indices):
                continue
            if alive and time.monotonic() < worker.deadline:
                still_busy.append(worker)
                continue
            worker.stop()
            if not alive and not worker.ready and not worker.garbage:
                raise RuntimeError(
                    f"reward worker failed to start (exit code {worker.proc.returncode}); its error is above. "
                    f"It runs: {sys.executable} -c 'import rlhf_mcore.rewards.workers'."
                )
            failed = ("timeout", f"reward call exceeded {timeout_s} s") if alive else ("error", worker.garbage) \
                if worker.garbage else ("error", f"reward worker died (exit code {worker.proc.returncode})")
            results[worker.indices[worker.pos]] = failed
            fresh = self._workers[self._workers.index(worker)] = self._start()
            rest = worker.indices[worker.pos + 1:]
            if rest:
                self._assign(fresh, rest, tasks, timeout_s)
                still_busy.append(fresh)
        return still_busy

    def _drain(self, worker: _Worker, results: list, timeout_s: float) -> bool:
        """Read every waiting message of ``worker``; False once it has exited (EOF)."""
        while worker.inbox.poll():
            try:
                msg = worker.inbox.recv()
            except (EOFError, OSError):
                return False
            except Exception as err:  # noqa: BLE001 - bytes that do not unpickle: the worker is replaced
                worker.garbage = f"reward worker sent an unreadable message ({type(err).__name__}); replaced it"
                return False
            ready = isinstance(msg, str) and msg == _READY
            if not ready and not _is_message(msg, worker):
                worker.garbage = f"reward worker sent a message outside the protocol ({msg!r:.80}); replaced it"
                return False
            if ready:
                worker.ready = True
            elif msg[0] == _FATAL:
                raise ValueError(
                    f"reward worker cannot load the reward function ({msg[1]}). Pass custom_fn as "
                    "'path/to/file.py:function_name' or a function importable by its module name."
                )
            else:
                results[msg[0]] = msg[1]
                worker.pos += 1
            worker.deadline = time.monotonic() + timeout_s
        return True
