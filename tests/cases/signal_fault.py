"""`python -m tests.worker signal_fault --config ... [a.b=value ...]`: rlhf_mcore.train, with SIGTERM sent to
this rank at exact points of the run, so that a test hits "mid-rollout" or "mid-save" every time.

    SIGNAL_AT="rlhf_mcore.trainer.phases:optimizer_step:3,rlhf_mcore.checkpoint.save_load:_save_role:2"

sends SIGTERM to itself just before the 3rd call of phases.optimizer_step and the 2nd of save_load._save_role
(`module:Class.method:n` works too).
SIGNAL_RANK (default: every rank) picks the rank; only the first attempt under torchrun is signalled.
"""
from __future__ import annotations

import functools
import importlib
import os
import signal
import time

SETTLE_S = 0.5  # seconds the signal's watcher gets to note it before the wrapped call runs


def signal_before_call(original, nth: int, signum: int = signal.SIGTERM):
    """`original`, wrapped: just before its nth call, send `signum` to this process (then call it as usual)."""
    calls = [0]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            print(f"signal_worker: sending {signal.Signals(signum).name} before call {nth} of {original.__name__}",
                  flush=True)
            os.kill(os.getpid(), signum)
            # the run blocks exit signals in this thread: its watcher thread notes them (trainer/signals.py). Give it
            # the interpreter before going on, or under load the step may end before the signal is noted, and the
            # run stops a step later than the test means (seen once in CI: step 4 instead of 3)
            time.sleep(SETTLE_S)
        return original(*args, **kwargs)

    return wrapper


def install(spec: str) -> None:
    for item in filter(None, spec.split(",")):
        module_name, name, nth = item.split(":")
        owner = importlib.import_module(module_name)
        *path, name = name.split(".")  # Class.method too
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, signal_before_call(getattr(owner, name), int(nth)))


def entry(argv: list[str]) -> int:
    """rlhf_mcore.train's main (argv is its command line) with the fault installed."""
    rank = int(os.environ.get("RANK", "0"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if first_attempt and os.environ.get("SIGNAL_RANK", str(rank)) == str(rank):
        install(os.environ.get("SIGNAL_AT", ""))
    from rlhf_mcore.train import main

    return main(argv)
