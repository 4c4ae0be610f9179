"""torchrun, as `launch/torchrun.sh` and `launch/slurm.sbatch` run it, with one change: a stop by signal ends
with the ranks' exit code, not a traceback.

    python -m rlhf_mcore.launcher [torchrun's arguments] -m rlhf_mcore.train --config ...

Slurm (`--signal=TERM@300`, `scancel`, preemption) signals the torchrun agent along with every rank. The ranks
finish their step, save it and exit 7 (`rlhf_mcore.trainer.signals`); torchrun passes its own SIGTERM on to them,
waits for them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) and then raises `SignalException`, a traceback and exit 1 that
hide the clean stop. Here, when every rank of this node ended with the same code, the agent prints one line and
exits with that code (7: saved and stopped); otherwise it exits 1 naming each rank's code. It also tells the
ranks its pid (RLHF_MCORE_LAUNCHER_PID): a rank started just as the agent was killed sees that its parent is gone.

Bad input is never retried: when every failed rank exited 2 (cannot start: the config, the data, a busy port), the
agent does not restart them (`--max-restarts` is for crashes, and a restart would print the same lines again),
and a failed run ends with the failed ranks' exit code after torchrun's summary, not with a traceback and 1.
"""
from __future__ import annotations

import os
import signal
import sys

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from rlhf_mcore.trainer.guards import EXIT_STARTUP

_codes: dict[int, int | None] = {}
_shutdown = LocalElasticAgent._shutdown
_monitor = LocalElasticAgent._monitor_workers
NO_RETRY = (EXIT_STARTUP,)


def _monitor_without_retrying_bad_input(self, worker_group):
    """torchrun's monitor; when every failed rank exited with a NO_RETRY code, no restarts are left."""
    result = _monitor(self, worker_group)
    failures = getattr(result, "failures", None) or {}
    if failures and all(f.exitcode in NO_RETRY for f in failures.values()) and self._remaining_restarts > 0:
        print(f"torchrun: the ranks exited {EXIT_STARTUP} (cannot start: see their lines above): not restarting "
              "them", file=sys.stderr, flush=True)
        self._remaining_restarts = 0
    return result


def _recording_shutdown(self, *args, **kwargs):
    """torchrun's own shutdown, then note each local rank's exit code (None: unknown)."""
    _shutdown(self, *args, **kwargs)
    handlers = getattr(getattr(self, "_pcontext", None), "subprocess_handlers", None) or {}
    _codes.update({rank: getattr(getattr(h, "proc", None), "returncode", None) for rank, h in handlers.items()})


def exit_code(signum: int, codes: dict[int, int | None]) -> tuple[int, str]:
    """(the agent's exit code, its one line) after a stop by `signum` with the ranks' `codes`.

    >>> exit_code(15, {0: 7, 1: 7})
    (7, 'torchrun: stopped by SIGTERM; every local rank exited 7')
    >>> exit_code(15, {0: 7, 1: -9})[0]
    1
    """
    name = signal.Signals(signum).name
    found = set(codes.values())
    if len(found) == 1 and None not in found and 0 not in found:
        code = found.pop()
        return code if code > 0 else 1, f"torchrun: stopped by {name}; every local rank exited {code}"
    listed = ", ".join(f"rank {r}: {c}" for r, c in sorted(codes.items())) or "no rank had started"
    return 1, f"torchrun: stopped by {name}; the local ranks exited differently ({listed})"


def failed_code(failures: dict) -> int:
    """The exit code of a failed run: the failed ranks' one code when they agree and it is positive, else 1.

    >>> import types
    >>> failed_code({0: types.SimpleNamespace(exitcode=2), 1: types.SimpleNamespace(exitcode=2)})
    2
    >>> failed_code({0: types.SimpleNamespace(exitcode=-9)})
    1
    """
    codes = {f.exitcode for f in failures.values()}
    return codes.pop() if len(codes) == 1 and next(iter(codes)) > 0 else 1


def main() -> int:
    LocalElasticAgent._shutdown = _recording_shutdown
    LocalElasticAgent._monitor_workers = _monitor_without_retrying_bad_input
    os.environ["RLHF_MCORE_LAUNCHER_PID"] = str(os.getpid())  # a rank whose agent died before it started exits
    try:
        torchrun_main()
    except SignalException as stop:
        code, line = exit_code(int(stop.sigval), _codes)
        print(line, file=sys.stderr, flush=True)
        return code
    except ChildFailedError as failed:  # torchrun's summary (the root cause with its traceback, each rank's code)
        print(failed.format_msg(), file=sys.stderr, flush=True)
        return failed_code(failed.failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
