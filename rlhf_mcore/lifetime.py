"""Processes that die with the run: the kernel's parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`).

`die_with_parent()` asks the kernel to SIGKILL this process when its parent goes (a rank when torchrun is
killed, even in the middle of start-up). `forked_children_die_with_us()` sets the same signal in every child
this process forks from its main thread (megatron's checkpoint writer processes, and through them the
multiprocessing resource tracker, which exits once no process holds its pipe): killing the trainer by pid
then leaves nothing behind. Children forked from other threads are left alone: the signal follows the
thread that forked, and a short-lived thread would take its child with it.
"""
from __future__ import annotations

import os
import signal
import threading

PR_SET_PDEATHSIG = 1
_state = {"registered": False, "main_thread_fork": False, "parent": 0}


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """True when the kernel will send `sig` to this process once its parent exits (Linux only)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig) == 0
    except (OSError, AttributeError):
        return False


def _before_fork() -> None:
    _state["main_thread_fork"] = threading.current_thread() is threading.main_thread()
    _state["parent"] = os.getpid()


def _after_fork_in_child() -> None:
    if _state["main_thread_fork"] and die_with_parent() and os.getppid() != _state["parent"]:
        os._exit(1)  # the parent died before the signal was set


def forked_children_die_with_us() -> None:
    """From now on, every child forked from the main thread is SIGKILLed when this process dies."""
    if not _state["registered"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _state["registered"] = True
