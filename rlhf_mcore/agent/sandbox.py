"""The sandbox process: one tool call in a fresh interpreter, under limits, then exit.

`launch` starts ``python -I -B -u`` with a one-line JSON spec on stdin; `main` then, in order:
1. asks the kernel to kill it with its parent (``lifetime.die_with_parent``);
2. loads the tool function (``origin``: ``"module:qualname"`` or a tools file) before any limit, so a
   user's tools file may import what it likes;
3. sets rlimits: address space (``memory_mb``), CPU seconds, file size (``file_mb``, SIGXFSZ ignored so a
   big write raises instead of killing), open files, no core dumps;
4. `namespaces.isolate`: new user (when not root), mount, PID, network, IPC and UTS namespaces, a private
   root that holds only what Python needs (`readable_paths`) and a working directory of ``disk_mb``, then
   no capabilities and, for a root trainer, uid 65534. From here it runs as PID 1 of its own namespace;
5. the layers that refuse the rest: `landlock` (reads of `readable_paths` only, writes in its working
   directory only, signals scoped to itself), the `seccomp` allow-list, and the Python-level `guards` (the
   same rules with readable messages); RLIMIT_NPROC=0 where seccomp is absent and the user is not root;
6. calls ``fn(arguments, context)`` and reports on the status pipe ``{"status": "ok", "value": ...}``
   (the value cut to ``max_chars``) or ``{"status": "exception", "error": "<last traceback line>"}``, the
   traceback (this package's frames cut) going to stderr like the code's own output. A process that ends
   without a status crashed.
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import sys
import traceback

from rlhf_mcore.agent.launch import cut_text

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/etc/localtime")


def main(spec: dict) -> None:
    from rlhf_mcore.lifetime import die_with_parent

    die_with_parent()
    if os.getppid() != spec["parent_pid"]:
        os._exit(1)  # the trainer died before the signal was set
    status = os.fdopen(spec["status_fd"], "w")
    try:
        fn = resolve(spec["origin"], spec["tool"])
    except Exception as err:  # noqa: BLE001 - reported to the model and the executor
        _report(status, {"status": "exception", "error": f"cannot load tool '{spec['tool']}': {err}"})
    layers = confine(spec)
    try:
        value = fn(spec["arguments"], spec["context"])
        value = value if isinstance(value, str) else json.dumps(value, default=str)
        report = {"status": "ok", "value": cut_text(value, spec["limits"]["max_chars"])[0], "layers": layers}
    except SystemExit as err:  # exit(0) / sys.exit() is a normal end of the code
        report = {"status": "ok", "value": "", "layers": layers} if err.code in (0, None) else \
            {"status": "exception", "error": f"SystemExit: {err.code}", "layers": layers}
    except BaseException as err:  # noqa: BLE001 - the code's error is the tool's result
        lines = format_user_traceback(err)
        sys.stderr.write("".join(lines))
        report = {"status": "exception", "error": cut_text(lines[-1].strip(), spec["limits"]["max_chars"])[0],
                  "layers": layers}
    _report(status, report)


def resolve(origin: str, name: str):
    """The tool function named by `origin`: ``"pkg.module:qualname"`` or the path of a tools file."""
    if origin.endswith(".py"):
        from rlhf_mcore.agent.custom import load_tools_file

        return load_tools_file(origin)[name].fn
    module, _, qualname = origin.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "fn", obj)  # a @tool-decorated name holds the Tool


def readable_paths(origin: str) -> list[str]:
    """What the code may read: the system's libraries, this interpreter's prefixes (stdlib, site-packages),
    this package, and the tool's own module or tools file."""
    paths = list(SYSTEM_PATHS) + [_PACKAGE]
    paths += [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    if origin.endswith(".py"):
        paths.append(os.path.realpath(origin))
    else:
        top = sys.modules.get(origin.partition(":")[0].split(".")[0])
        where = list(getattr(top, "__path__", [])) or [getattr(top, "__file__", None) or ""]
        paths += [os.path.realpath(p) for p in where if p]
    return paths


def confine(spec: dict) -> list[str]:
    """Set the limits, enter the namespaces and install the guards; the layers that hold (for the report)."""
    from rlhf_mcore.agent import guards, landlock, namespaces, seccomp

    limits = spec["limits"]
    cpu_s = int(limits["cpu_s"])
    _limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
    _limit(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    _limit(resource.RLIMIT_FSIZE, limits["file_mb"] << 20)
    _limit(resource.RLIMIT_NOFILE, 256)
    _limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    workdir = spec["workdir"]
    readable = readable_paths(spec["origin"])
    layers = namespaces.isolate(readable, workdir, int(limits["disk_mb"]), spec["parent_pid"])
    proc = ["/proc"] if "proc" in layers else []  # its own /proc only, never the host's
    layers += landlock.restrict(readable + list(namespaces.DEV_FILES) + proc, [workdir, "/dev/null"])
    if seccomp.install_filter():
        layers.append("seccomp")
    elif os.getuid() != 0:
        _limit(resource.RLIMIT_NPROC, 0)
        layers.append("nproc")
    guards.block_network()
    guards.block_processes()
    guards.confine_writes(workdir)
    return layers


def _limit(kind: int, soft: int, hard: int | None = None) -> None:
    _, old_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    try:
        resource.setrlimit(kind, (soft, hard))
    except (ValueError, OSError):
        resource.setrlimit(kind, (min(soft, old_hard), old_hard))


def format_user_traceback(err: BaseException) -> list[str]:
    """The traceback lines without this package's frames (the sandbox, the tool runner, the guards)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(_HERE)]
    head = ["Traceback (most recent call last):\n"] if frames else []
    return head + traceback.format_list(frames) + traceback.format_exception_only(type(err), err)


def _report(status, report: dict) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the code closed or replaced its streams
            pass
    try:
        status.write(json.dumps(report))
        status.flush()
    finally:
        os._exit(0)
