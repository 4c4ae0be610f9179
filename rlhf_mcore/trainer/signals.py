"""SIGTERM / SIGINT (Slurm's time limit and preemption, torchrun passing on its own signal, Ctrl-C): finish the
step, save a checkpoint, leave together.

The handler only notes the signal. Every rank learns of it at the end of the step, from the one all-reduce per
step that also carries rank 0's time-limit verdict (`agree_stop`), so a signal that reaches a single rank stops
all of them at the same step. Then `stop_on_signal` saves a verified checkpoint of that step (unless one is
already there, or `trainer.save_on_signal=false`) and the run exits with `EXIT_SIGNAL` (7), releasing the
run-directory lock on the way out. A signal during validation or a periodic save is seen at the end of the next
step. Before the first step (start-up, when a rank may wait for a peer that died) a signal exits at once, with
code 7: there is nothing to save yet.

A second signal within `repeat_window_s` (trainer.repeat_signal_window_s, 5 s) of the first is the same stop, not
a second one: Slurm (`--signal`, `scancel`, preemption) signals torchrun's agent and every rank at once, and the
agent then passes its own signal on to the ranks, so each rank receives two at once. It is logged and the save
goes on. A second signal after that window exits at once with `EXIT_SIGNAL_FORCED` (8), even while the main
thread waits inside a collective or a kernel: the C-level handler writes the signal's number to a pipe
(`signal.set_wakeup_fd`) that a watcher thread reads, and that thread kills this rank's helper processes and
calls `os._exit`. A save cut short that way leaves only a `global_step_N.tmp-*` directory (removed at the next
start); the previous checkpoint and the `latest` pointer are untouched, since a checkpoint is published by a
rename once complete and `latest` moves only after the new one verifies (`rlhf_mcore.checkpoint.save_load`).

While the run is on, the main thread blocks both signals (the watcher receives them), and so every process it
starts inherits the block: reward workers, megatron's checkpoint writers and their results queue survive the
SIGTERM that torchrun and Slurm send to the whole process group, and the step and the save can finish. They end
with their parent: a process forked by the main thread (megatron's checkpoint writers) is SIGKILLed by the
kernel when this one dies, so that a rank killed with -9 leaves nothing holding its sockets (its peers then see
the loss at once) or the run-directory lock (a restarted attempt can take it).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.lifetime import forked_children_die_with_us
from rlhf_mcore.trainer.guards import EXIT_SIGNAL, EXIT_SIGNAL_FORCED, StoppedBySignal

log = logging.getLogger(__name__)
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP_WATCHER = b"\0"


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker unblocks SIGINT and SIGTERM after it starts (Python 3.11): start it
    before they are blocked, so that a later spawn (megatron's results queue) finds it running."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except (ImportError, OSError):
        pass


def _note(signum, frame) -> None:
    """The Python-level handler: nothing to do, the watcher thread has seen the signal already."""


def kill_descendants() -> None:
    """SIGKILL every process this one started (and theirs), so that a forced exit leaves none behind."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


class ExitSignals:
    """While entered: the first SIGTERM/SIGINT sets `received` (its number), the second exits the process.

    Main thread only (Python's rule for signal handlers). On exit the previous handlers, wakeup fd and signal
    mask come back, and a signal that arrived in between is delivered to them."""

    def __init__(self, rank: int = 0, repeat_window_s: float = 0.0):
        self.rank = rank
        self.repeat_window_s = repeat_window_s
        self.received = 0
        self.received_at = 0.0
        self.armed = False
        self._saved: dict = {}
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ExitSignals:
        forked_children_die_with_us()
        _start_resource_tracker()
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        self._thread = threading.Thread(target=self._watch, name="exit-signals", daemon=True)
        self._thread.start()  # before the mask below: this thread keeps receiving both signals
        self._saved = {sig: signal.signal(sig, _note) for sig in EXIT_SIGNALS}
        self._saved["wakeup_fd"] = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._saved["mask"] = signal.pthread_sigmask(signal.SIG_BLOCK, EXIT_SIGNALS)
        return self

    def hold(self) -> None:
        """Block both signals in the main thread again (a library may have unblocked them)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, EXIT_SIGNALS)

    def __exit__(self, *exc) -> None:
        signal.set_wakeup_fd(self._saved["wakeup_fd"])
        for sig in EXIT_SIGNALS:
            signal.signal(sig, self._saved[sig])
        read_fd, write_fd = self._pipe
        os.write(write_fd, _STOP_WATCHER)
        self._thread.join(timeout=5)
        os.close(read_fd)
        os.close(write_fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._saved["mask"])

    def _watch(self) -> None:
        while True:
            data = os.read(self._pipe[0], 64)
            for signum in data:
                if signum == 0:
                    return
                if signum in EXIT_SIGNALS:
                    self._on_signal(signum)

    @staticmethod
    def _exit(code: int) -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()
        kill_descendants()
        os._exit(code)

    def arm(self) -> None:
        """Training starts: from now on the first signal waits for the end of the step. Before, there is
        nothing to save, and a rank may be stuck in start-up (a peer that died): it exits at once."""
        self.armed = True

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.armed:
            log.warning("rank %d: received %s before training started: exiting now with code %d (nothing to save)",
                        self.rank, name, EXIT_SIGNAL)
            self._exit(EXIT_SIGNAL)
        since = time.monotonic() - self.received_at
        if self.received and since < self.repeat_window_s:
            log.warning("rank %d: %s again %.1f s after the first signal: the same stop (torchrun passes on the signal "
                        "that Slurm also sent to every rank); still saving. Send it again after %g s to exit at "
                        "once, without saving", self.rank, name, since, self.repeat_window_s)
            return
        if self.received:
            log.error("rank %d: second exit signal (%s): exiting now with code %d, without saving; the last "
                      "published checkpoint is intact", self.rank, name, EXIT_SIGNAL_FORCED)
            self._exit(EXIT_SIGNAL_FORCED)
        self.received, self.received_at = signum, time.monotonic()
        log.warning("rank %d: received %s: finishing this step, then saving a checkpoint and exiting (send it "
                    "again to exit at once, without saving)", self.rank, name)


def agree_stop(ctx, out_of_time: bool, signals: ExitSignals) -> tuple[bool, int, int]:
    """Collective, one small all-reduce per step: (rank 0 is out of time, the exit signal any rank received or
    0, the highest rank that received one), the same on every rank."""
    signals.hold()
    signaled = signals.received
    flags = torch.tensor([float(out_of_time and ctx.rank == 0), float(signaled), float(ctx.rank if signaled else -1)],
                         device=ctx.device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    timed_out, signum, by_rank = flags.tolist()
    return bool(timed_out), int(signum), int(by_rank)


def stop_on_signal(run, step: int, signum: int, by_rank: int) -> StoppedBySignal:
    """Collective: save `step` (unless a verified checkpoint of it exists, or trainer.save_on_signal=false) and
    return the stop to raise. Every rank calls it at the same step (`agree_stop`)."""
    from rlhf_mcore.checkpoint.layout import find_latest, step_dir
    from rlhf_mcore.checkpoint.verify import checkpoint_problems

    name = signal.Signals(signum).name
    head = f"stopped at step {step} by {name} (received by rank {by_rank})"
    existing = step_dir(run.run_dir, step)
    have = run.agree(existing.is_dir() and not checkpoint_problems(existing))  # rank 0's view, on every rank
    if not run.cfg.trainer.save_on_signal:
        saved, what = None, "not saved (trainer.save_on_signal=false)"
    elif have:
        saved, what = str(existing), f"{existing.name} already exists and verifies; not saved again"
    else:
        if run.ctx.is_logging_rank:
            log.info("step %d: %s received: saving a checkpoint", step, name)
        saved = run.save(step)
        what = f"saved and verified {saved}" if saved else "not saved: the step skipped an update (non-finite)"
    if saved and run.ctx.is_logging_rank:
        log.info("step %d: checkpoint %s written; exiting on %s", step, saved, name)
    newest = saved or find_latest(run.run_dir)
    resume = (f"resume with trainer.resume=auto (the default) from {Path(newest).name}" if newest else
              "there is no checkpoint to resume from")
    return StoppedBySignal(f"{head}: {what}; {resume}.")
