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


_SPAWNED_PREFIX = ("import ctypes, os; ctypes.CDLL(None).prctl({sig}, 9); "
                   "os.getppid() == {parent} or os._exit(1); ")  # PR_SET_PDEATHSIG = 1, then the parent check


def spawn_command_line(line: list[str], parent: int) -> list[str]:
    """multiprocessing's spawn command `line` with the parent-death signal set first in the child's ``-c`` code.

    >>> spawn_command_line(["python", "-B", "-c", "main()", "--multiprocessing-fork"], 42)[3]
    'import ctypes, os; ctypes.CDLL(None).prctl(1, 9); os.getppid() == 42 or os._exit(1); main()'
    """
    line = list(line)
    if "-c" in line[:-1]:
        at = line.index("-c") + 1
        line[at] = _SPAWNED_PREFIX.format(sig=PR_SET_PDEATHSIG, parent=parent) + line[at]
    return line


def forked_children_die_with_us() -> None:
    """From now on, every child forked from the main thread is SIGKILLed when this process dies, and so is every
    child started by multiprocessing's spawn (megatron's results-queue manager): it never runs this process's
    fork hooks, so its command line sets the signal itself. The resource tracker then ends too (it exits once no
    process holds its pipe)."""
    if not _state["registered"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        from multiprocessing import spawn

        original = spawn.get_command_line
        spawn.get_command_line = lambda **kwargs: spawn_command_line(original(**kwargs), os.getpid())
        _state["registered"] = True
