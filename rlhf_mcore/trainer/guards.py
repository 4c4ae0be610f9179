"""What stops a run on purpose, and with which exit code.

Every guard raises a `RunStopped` subclass; `rlhf_mcore.train.main` turns it into one message on rank 0 and
the guard's exit code on every rank, with no traceback:

    2  a problem found before the model is built (config, paths, data, rewards, locked output directory)
    3  training diverged: too many steps in a row with a non-finite loss or grad norm, or non-finite weights
    4  the reward functions fail for too many calls, several steps in a row
    5  a collective operation timed out (another rank froze, died or is far slower)
    6  no space left on the device of trainer.output_dir
    7  stopped by SIGTERM or SIGINT (on any rank) after the step, with its checkpoint saved (`trainer.signals`)
    8  a second SIGTERM or SIGINT: exited at once, without saving (the last published checkpoint is intact)

The counters are plain objects (no torch.distributed): every rank feeds them the same global numbers, so
every rank stops at the same step.
"""
from __future__ import annotations

import dataclasses

EXIT_STARTUP, EXIT_DIVERGED, EXIT_REWARD_HEALTH, EXIT_COLLECTIVE_TIMEOUT, EXIT_DISK_FULL = 2, 3, 4, 5, 6
EXIT_SIGNAL, EXIT_SIGNAL_FORCED = 7, 8


class RunStopped(RuntimeError):
    """A deliberate stop: `lines` are printed one per line; `exit_code` is the process's exit status."""

    exit_code = 1

    def __init__(self, lines: list[str] | str):
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


class StartupError(RunStopped):
    exit_code = EXIT_STARTUP


class DivergedError(RunStopped):
    exit_code = EXIT_DIVERGED


class RewardHealthError(RunStopped):
    exit_code = EXIT_REWARD_HEALTH


class CollectiveTimeoutError(RunStopped):
    exit_code = EXIT_COLLECTIVE_TIMEOUT


class DiskFullError(RunStopped):
    exit_code = EXIT_DISK_FULL


class StoppedBySignal(RunStopped):
    exit_code = EXIT_SIGNAL


@dataclasses.dataclass
class BadStepGuard:
    """Counts steps in a row whose optimizer update was skipped; raises at `max_bad_steps`.

    >>> g = BadStepGuard(max_bad_steps=2)
    >>> g.update(step=1, num_skipped=1), g.update(step=2, num_skipped=0), g.update(step=3, num_skipped=1)
    (1, 0, 1)
    >>> g.update(step=4, num_skipped=2)
    Traceback (most recent call last):
    ...
    rlhf_mcore.trainer.guards.DivergedError: training stopped at step 4: 2 steps in a row had a non-finite loss or \
grad norm, so their updates were skipped (trainer.max_bad_steps=2); the last step that applied all its updates \
is step 2, and no checkpoint was written or deleted since. Lower actor.optim.lr (or critic.optim.lr), check the \
reward scale, and resume from a checkpoint.
    """

    max_bad_steps: int
    streak: int = 0
    last_good_step: int = 0

    def update(self, step: int, num_skipped: int) -> int:
        """The number of bad steps in a row after `step` (which skipped `num_skipped` optimizer updates)."""
        if num_skipped == 0:
            self.streak, self.last_good_step = 0, step
            return 0
        self.streak += 1
        if self.streak >= self.max_bad_steps:
            raise DivergedError(
                f"training stopped at step {step}: {self.streak} steps in a row had a non-finite loss or grad norm, "
                f"so their updates were skipped (trainer.max_bad_steps={self.max_bad_steps}); the last step that "
                f"applied all its updates is step {self.last_good_step}, and no checkpoint was written or deleted "
                "since. Lower actor.optim.lr (or critic.optim.lr), check the reward scale, and resume from a "
                "checkpoint.")
        return self.streak


@dataclasses.dataclass
class RewardHealthGuard:
    """Raises when more than `max_error_frac` of reward calls fail or time out for `max_error_steps` steps in a row.

    >>> g = RewardHealthGuard(max_error_frac=0.5, max_error_steps=2)
    >>> g.update(step=1, num_failed=3, num_calls=4), g.update(step=2, num_failed=1, num_calls=4)
    (1, 0)
    >>> g.update(step=3, num_failed=4, num_calls=4)
    1
    >>> g.update(step=4, num_failed=4, num_calls=4)
    Traceback (most recent call last):
    ...
    rlhf_mcore.trainer.guards.RewardHealthError: training stopped at step 4: more than 50% of the reward calls failed \
or timed out in 2 steps in a row (reward.max_error_frac=0.5, reward.max_error_steps=2; 100% at this step). The \
warnings above show the first error of each step. Fix the reward function or its data, or raise reward.timeout_s.
    """

    max_error_frac: float
    max_error_steps: int
    streak: int = 0

    def update(self, step: int, num_failed: float, num_calls: float) -> int:
        frac = num_failed / max(num_calls, 1.0)
        self.streak = self.streak + 1 if frac > self.max_error_frac else 0
        if self.streak >= self.max_error_steps:
            raise RewardHealthError(
                f"training stopped at step {step}: more than {self.max_error_frac:.0%} of the reward calls failed or "
                f"timed out in {self.streak} steps in a row (reward.max_error_frac={self.max_error_frac}, "
                f"reward.max_error_steps={self.max_error_steps}; {frac:.0%} at this step). The warnings above show "
                "the first error of each step. Fix the reward function or its data, or raise reward.timeout_s.")
        return self.streak


def is_collective_timeout(err: BaseException) -> bool:
    """True for the errors gloo, NCCL and the c10d store raise when a collective or a store wait times out
    (RuntimeError subclasses such as DistBackendError and DistStoreError, or TimeoutError)."""
    if not isinstance(err, (RuntimeError, TimeoutError)):
        return False
    text = f"{type(err).__name__}: {err}".lower()
    return any(mark in text for mark in ("timed out", "timeout", "time out", "deadline exceeded"))


def collective_timeout_error(err: BaseException, timeout_min: float) -> CollectiveTimeoutError:
    first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    return CollectiveTimeoutError(
        f"a collective operation timed out after parallel.collective_timeout_min={timeout_min:g} min "
        f"({timeout_min * 60:.0f} s): another rank is frozen, dead or much slower ({type(err).__name__}: {first}). "
        "Check the other ranks' logs; raise parallel.collective_timeout_min if ranks legitimately wait longer.")
