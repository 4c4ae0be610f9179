"""torchrun, as `launch/torchrun.sh` and `launch/slurm.sbatch` run it, with one change: a stop by signal ends
with the ranks' exit code, not a traceback.

    python -m rlhf_mcore.launcher [torchrun's arguments] -m rlhf_mcore.train --config ...

Slurm (`--signal=TERM@300`, `scancel`, preemption) signals the torchrun agent along with every rank. The ranks
finish their step, save it and exit 7 (`rlhf_mcore.trainer.signals`); torchrun passes its own SIGTERM on to them,
waits for them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) and then raises `SignalException`, a traceback and exit 1 that
hide the clean stop. Here, when every rank of this node ended with the same code, the agent prints one line and
exits with that code (7: saved and stopped); otherwise it exits 1 naming each rank's code. It also tells the
ranks its pid (RLHF_MCORE_LAUNCHER_PID): a rank started just as the agent was killed sees that its parent is gone.
"""
from __future__ import annotations

import os
import signal
import sys

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

_codes: dict[int, int | None] = {}
_shutdown = LocalElasticAgent._shutdown


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


def main() -> int:
    LocalElasticAgent._shutdown = _recording_shutdown
    os.environ["RLHF_MCORE_LAUNCHER_PID"] = str(os.getpid())  # a rank whose agent died before it started exits
    try:
        torchrun_main()
    except SignalException as stop:
        code, line = exit_code(int(stop.sigval), _codes)
        print(line, file=sys.stderr, flush=True)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
