"""Run a command as an unprivileged user from a root test process: `as_user(cmd)`.

CI and the development machine keep Python under /root (mode 0700), which no other user may enter. The
command therefore runs in a private mount namespace where the highest such directory is a fresh tmpfs
(mode 0755) holding binds of just the entries the interpreter needs; then ``setpriv`` changes to uid/gid
`USER_ID` with no groups and no capabilities. The user sees the interpreter and this repository and
nothing else of /root: a real unprivileged user, as a shared GPU node runs jobs.
"""
from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys

USER_ID = 1000


def closed_ancestor(path: str) -> str | None:
    """The highest directory above `path` that other users may not enter (None: all may)."""
    parts = os.path.realpath(path).split("/")[1:]
    for i in range(1, len(parts)):
        here = "/" + "/".join(parts[:i])
        if not os.stat(here).st_mode & stat.S_IXOTH:
            return here
    return None


def can_switch_user() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None and shutil.which("unshare") is not None


def as_user(cmd: list[str], scratch: str) -> list[str]:
    """`cmd` run as uid USER_ID; needs root (`can_switch_user`). `scratch`: an empty directory of the test's
    (it holds the mount points that keep /root's entries reachable)."""
    drop = ["setpriv", f"--reuid={USER_ID}", f"--regid={USER_ID}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]
    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.executable)}
    closed = {a for a in map(closed_ancestor, paths) if a}
    if not closed:
        return drop + cmd
    steps = ["set -e", f"keep={shlex.quote(scratch)}"]
    for n, top in enumerate(sorted(closed)):
        entries = sorted({os.path.relpath(p, top).split("/")[0] for p in paths if p.startswith(top + "/")})
        steps += [f"mkdir $keep/{n}", f"mount --bind {shlex.quote(top)} $keep/{n}",
                  f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(top)}"]
        for entry in entries:
            inside = shlex.quote(f"{top}/{entry}")
            steps += [f"mkdir {inside}", f"mount --bind $keep/{n}/{shlex.quote(entry)} {inside}"]
    steps.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(steps), "sh", *drop, *cmd]
