"""Run ``call(i)`` for every item in forked children, each call under its own deadline.

A reward is user code: it can raise, loop forever or hang inside a C regex, where no signal or thread can
stop it. Each batch is therefore split over ``num_workers`` forked children; a child reports every finished
item through a pipe, and a child that reports nothing for ``timeout_s`` (counted from its "ready" message,
so a slow fork is not charged to the first call) is killed with SIGKILL. Its current item becomes a
time-out and a new child takes over the rest of its shard. A child that dies (segfault, ``os._exit``) turns
its current item into an error the same way. Fork copies the caller's memory, so the inputs and ``call``
itself are never pickled; only the small outcomes travel back. Reward code in the child must not use CUDA
(forked after the parent initialised it); rule-based rewards never do.

Outcomes are tuples: ``("ok", score, extra)``, ``("error", message)`` or ``("timeout", message)``.

>>> run_with_deadlines(lambda i: ("ok", float(i * i), {}), 4, timeout_s=5.0, num_workers=2)
[('ok', 0.0, {}), ('ok', 1.0, {}), ('ok', 4.0, {}), ('ok', 9.0, {})]
"""
from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

Outcome = tuple
Call = Callable[[int], Outcome]
_READY = "ready"
_START_GRACE_S = 60.0  # how long a new child may take to report ready before it counts as hung


@dataclass(slots=True)
class _Child:
    proc: Any  # multiprocessing Process
    conn: Connection
    indices: list[int]
    pos: int  # indices[pos] is the item being computed now
    deadline: float


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


def _child_main(call: Call, indices: list[int], conn: Connection) -> None:
    conn.send(_READY)  # start the first deadline now, not at fork: a loaded machine can be slow to fork
    for i in indices:
        outcome = call(i)
        try:
            conn.send((i, outcome))
        except Exception as err:  # an unpicklable extra value
            conn.send((i, ("error", f"reward output cannot be sent back: {type(err).__name__}: {err}")))
    conn.close()


def _start(call: Call, indices: list[int], timeout_s: float) -> _Child:
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(call, indices, writer), daemon=True)
    proc.start()
    writer.close()  # only the child writes; EOF then means the child is gone
    return _Child(proc, reader, indices, 0, time.monotonic() + timeout_s + _START_GRACE_S)


def _stop(child: _Child, kill: bool) -> None:
    if kill:
        child.proc.kill()
    child.proc.join()
    child.conn.close()


def _replace(child: _Child, outcome: Outcome, results: list, call: Call, timeout_s: float) -> _Child | None:
    """Record ``outcome`` for the current item of a stopped child; start a child for what is left."""
    results[child.indices[child.pos]] = outcome
    rest = child.indices[child.pos + 1:]
    return _start(call, rest, timeout_s) if rest else None


def _drain(child: _Child, results: list, timeout_s: float) -> bool:
    """Read every message waiting from ``child``; False when the child has exited (EOF)."""
    while child.conn.poll():
        try:
            msg = child.conn.recv()
        except EOFError:
            return False
        if msg != _READY:
            i, outcome = msg
            results[i] = outcome
            child.pos += 1
        child.deadline = time.monotonic() + timeout_s
    return True


def run_with_deadlines(call: Call, num_items: int, *, timeout_s: float, num_workers: int) -> list[Outcome]:
    """Outcomes of ``call(i)`` for ``i in range(num_items)``, in order; never raises for a failing call."""
    if timeout_s <= 0 or num_workers < 1:
        raise ValueError(f"need timeout_s > 0 and num_workers >= 1 (got {timeout_s}, {num_workers})")
    results: list = [None] * num_items
    active = [_start(call, shard, timeout_s) for shard in split_shards(num_items, num_workers)]
    try:
        while active:
            active = _step(active, results, call, timeout_s)
    finally:  # an interrupt (Ctrl-C) in the parent must not leave children running
        for child in active:
            _stop(child, kill=True)
    return results


def _step(active: list[_Child], results: list, call: Call, timeout_s: float) -> list[_Child]:
    """Wait for the next message or deadline; return the children still running afterwards."""
    soonest = min(c.deadline for c in active)
    wait([c.conn for c in active], timeout=max(0.0, soonest - time.monotonic()))
    survivors = []
    for child in active:
        alive = _drain(child, results, timeout_s)
        if child.pos == len(child.indices):
            _stop(child, kill=False)
            continue
        if not alive:
            _stop(child, kill=False)
            died = ("error", f"reward worker died (exit code {child.proc.exitcode})")
            child = _replace(child, died, results, call, timeout_s)
        elif time.monotonic() >= child.deadline:
            _stop(child, kill=True)
            late = ("timeout", f"reward call exceeded {timeout_s} s")
            child = _replace(child, late, results, call, timeout_s)
        if child is not None:
            survivors.append(child)
    return survivors
