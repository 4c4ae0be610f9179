"""The one way tests start processes: `torchrun` for multi-rank gloo runs, `cli` for the shipped commands,
`worker` for named cases of the shared worker (tests/worker.py), several per launch.

    out = torchrun("tools.check_layouts", 4, "--config", TINY, "--layouts", "1x1,2x2")
    out = cli("rlhf_mcore.train", "--config", TINY, "trainer.total_steps=2")
    out = worker(2, ("train_run", out_json, config, "parallel.tp=2"), ("train_run", out_json2, config))

Each returns what `subprocess.run` returns (text, output captured) and, with check=True, fails the test with
the tail of both streams when the exit code is not 0. Every process runs from the repository root with it on
PYTHONPATH, so `-m tools.X` and `-m tests.X` resolve in a fresh clone.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.ports import free_port

TAIL = 4000
# set in the pytest process by the one-rank mcore_ctx fixture: a child inheriting them would rendezvous on it
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def env(extra: dict | None = None) -> dict:
    """The environment of a launched process: ours without the rendezvous variables, the repository on
    PYTHONPATH, unbuffered output."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    mine = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    return {**mine, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(extra or {})}


def _entry(entry: str) -> list[str]:
    """A module name runs with -m; a path to a .py file runs as a script; "-c" passes code on."""
    return [entry] if entry.endswith(".py") or entry == "-c" else ["-m", entry]


def run(cmd: list[str], timeout: float, check: bool, extra_env: dict | None = None, cwd=ROOT,
        log: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """With `log`, stdout and stderr go to that file and come back as stdout: a killed rank's leftover child
    cannot keep the test waiting for a pipe to close."""
    cmd = [str(c) for c in cmd]
    if log is None:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env(extra_env), **kw)
    else:
        with open(log, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout,
                                  env=env(extra_env), **kw)
        proc.stdout, proc.stderr = Path(log).read_text(), ""
    if check:
        assert proc.returncode == 0, f"rc {proc.returncode}: {' '.join(map(str, cmd))}\n" + \
            proc.stdout[-TAIL:] + proc.stderr[-TAIL:]
    return proc


def cli_cmd(entry: str, *args) -> list[str]:
    """The command line of one process of `entry`."""
    return [sys.executable, *_entry(entry), *map(str, args)]


def torchrun_cmd(entry: str, nproc: int, *args) -> list[str]:
    """The command line of `entry` on `nproc` gloo ranks of one standalone torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *_entry(entry), *map(str, args)]


def worker_cmd(case: str, *args) -> list[str]:
    """The command line of one process of the shared worker running `case` (tests/worker.py)."""
    return cli_cmd("tests.worker", case, *args)


def spawn(cmd: list[str], log: Path, environ: dict) -> subprocess.Popen:
    """A background process for tests that signal or kill it: its output goes to `log` (never a pipe a stray
    child could hold open), in a session of its own (os.killpg reaches its children), `environ` as given."""
    with open(log, "w") as f:
        return subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=environ,
                                start_new_session=True)


def torchrun(entry: str, nproc: int, *args, timeout: float = 600, check: bool = True,
             extra_env: dict | None = None, log: Path | None = None) -> subprocess.CompletedProcess:
    """`entry` (a module or a script) on `nproc` gloo ranks of one standalone torchrun."""
    return run(torchrun_cmd(entry, nproc, *args), timeout, check, extra_env, log=log)


def cli(entry: str, *args, timeout: float = 600, check: bool = True, extra_env: dict | None = None,
        cwd=ROOT, log: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """One process of a shipped command (`rlhf_mcore.train`, `tools.convert_checkpoint`, ...) or a script. It
    gets a free MASTER_PORT of its own (a one-rank process group needs one; no torchrun picks it)."""
    one_rank = {"MASTER_PORT": str(free_port()), **(extra_env or {})}
    return run(cli_cmd(entry, *args), timeout, check, one_rank, cwd=cwd, log=log, **kw)


def worker(nproc: int, *runs, timeout: float = 600, check: bool = True, extra_env: dict | None = None,
           log: Path | None = None) -> subprocess.CompletedProcess:
    """The shared worker (tests/worker.py) running `runs`, each (case, *args), one after another in ONE launch:
    `nproc` gloo ranks under torchrun, or one plain process with nproc=0."""
    argv: list[str] = []
    for case_argv in runs:
        argv += (["--then"] if argv else []) + [str(a) for a in case_argv]
    if nproc:
        return torchrun("tests.worker", nproc, *argv, timeout=timeout, check=check, extra_env=extra_env, log=log)
    return cli("tests.worker", *argv, timeout=timeout, check=check, extra_env=extra_env, log=log)


def outputs(stdout: str) -> list[dict]:
    """What rank 0 printed during each case of a multi-case worker launch, in order:
    [{"name": case, "rc": its exit code, "out": its lines}] (the markers of tests/worker.py)."""
    found, current = [], None
    for line in stdout.splitlines():
        if line.startswith("[tests.worker] begin "):
            current = {"name": line.split()[3], "rc": None, "out": []}
        elif line.startswith("[tests.worker] end ") and current is not None:
            current["rc"] = int(line.rsplit("rc=", 1)[1])
            current["out"] = "\n".join(current["out"])
            found.append(current)
            current = None
        elif current is not None:
            current["out"].append(line)
    return found
