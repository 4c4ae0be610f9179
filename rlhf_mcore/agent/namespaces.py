"""Namespaces, a minimal root and no privileges for the sandbox process.

`isolate` runs in the sandbox process before any model code:
1. ``unshare`` new mount, PID, network (no interfaces), IPC and UTS namespaces: as root directly, otherwise
   inside a new user namespace that maps only the caller's own uid and gid;
2. forks: the child is PID 1 of the new PID namespace and goes on; the parent only waits for it and exits
   the same way (so the trainer sees one process that ends as the code ended). When PID 1 ends, the kernel
   kills everything else in its namespace: nothing the call started outlives it;
3. `build_root`: a fresh tmpfs root holding read-only binds of what Python needs (`readable`) and nothing
   else (no home, no run directory, no /etc/passwd), a private ``/proc`` that shows only the sandbox, the
   few ``/dev`` files Python opens, and the working directory as a tmpfs of ``disk_mb`` (the call's disk
   quota; it vanishes with the namespace whatever the code did to its modes). ``pivot_root`` then detaches
   the host's tree;
4. `drop_privileges`: no capabilities (bounding and ambient sets emptied), and a root trainer's sandbox
   changes to uid/gid 65534 (nobody). Where no namespace can be made, the uid change and capability drop
   still happen and the sandbox's Landlock read rules stand in for the private root.

The names of what held come back for the sandbox's report (``user``, ``mount``, ``pid``, ``net``, ``ipc``,
``uts``, ``proc``: the private /proc, ``uid``, ``caps``).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

from rlhf_mcore.agent.syscalls import ARCHES, numbers

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = {"mount": CLONE_NEWNS, "pid": CLONE_NEWPID, "net": CLONE_NEWNET, "ipc": CLONE_NEWIPC,
              "uts": CLONE_NEWUTS}
NOBODY = 65534
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_ST_TO_MS = {1: _MS_RDONLY, 2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: _MS_NOATIME, 2048: _MS_NODIRATIME,
             4096: _MS_RELATIME}  # statvfs f_flag bit -> mount flag (a remount must keep the locked ones)
_MNT_DETACH = 2
_PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 23, 24, 47, 4
_CAP_VERSION_3 = 0x20080522
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _syscall(name: str, *args) -> int:
    return _libc.syscall(numbers(os.uname().machine)[name], *args)


def isolate(readable: list[str], workdir: str, disk_mb: int, parent_pid: int) -> list[str]:
    """Enter the namespaces, the private root and drop privileges; the names of what held. Returns in the
    sandboxed child only (the parent waits for it and exits with it). `parent_pid`: the trainer's pid."""
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    sources = top_level([p for p in readable + list(DEV_FILES) if not (workdir + "/").startswith(p.rstrip("/") + "/")])
    held = _unshare(root, uid, gid)
    watch = _fork_and_wait(root, parent_pid) if "pid" in held else -1
    if "mount" in held:
        try:
            if build_root(sources, workdir, disk_mb, NOBODY if root else uid, NOBODY if root else gid):
                held.append("proc")
        except OSError as err:  # half a root: no safe way on; the executor reports the crash and this line
            sys.stderr.write(f"sandbox: cannot build its private root: {err}\n")
            sys.stderr.flush()
            os._exit(70)
    elif root:
        os.chown(workdir, NOBODY, NOBODY)
    held += drop_privileges(root)
    _stay_tied(watch, parent_pid)
    return held


def _stay_tied(watch: int, parent_pid: int) -> None:
    """Arm the parent-death signal again (a change of uid clears it) and exit if the parent is already gone:
    `watch` is a pipe the parent holds open (-1: no fork; the parent is then `parent_pid`)."""
    from rlhf_mcore.lifetime import die_with_parent

    die_with_parent()
    gone = select.select([watch], [], [], 0)[0] if watch >= 0 else os.getppid() != parent_pid
    if gone:
        os._exit(1)
    if watch >= 0:
        os.close(watch)


def _unshare(root: bool, uid: int, gid: int) -> list[str]:
    flags = sum(NAMESPACES.values()) | (0 if root else CLONE_NEWUSER)
    if os.uname().machine not in ARCHES or _libc.unshare(flags) != 0:
        return []
    if not root:
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError:
            os._exit(70)  # half-made namespaces: no safe way on; the executor reports a crash
    return (["user"] if not root else []) + list(NAMESPACES)


def _fork_and_wait(root: bool, parent_pid: int) -> int:
    """Fork; the child (PID 1 in the new namespace) returns the read end of a pipe whose write end only
    the parent holds; the parent mirrors the child's end, and dies with the trainer."""
    watch, held_open = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(held_open)
        os.setsid()  # its own session and group: kill(0) reaches nothing else
        return watch
    os.close(watch)
    if root:
        drop_privileges(root)
    _stay_tied(-1, parent_pid)
    for fd in range(3, 256):  # hold no pipe of the trainer's: the child's end closes them
        if fd != held_open:
            try:
                os.close(fd)
            except OSError:
                pass
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 70)


def build_root(sources: list[str], workdir: str, disk_mb: int, uid: int, gid: int) -> bool:
    """Make a tmpfs holding read-only binds of `sources` (/dev files among them), /proc and a tmpfs `workdir` (owned
    by uid:gid), the root (the host's tree detached), and cd into `workdir`. False when /proc could not be
    mounted (a host whose /proc is partly masked refuses it): the root then has none."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    new = workdir  # an empty directory of the trainer's: the mount point of the new root
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,mode=0755")
    for source in sources:
        _bind_read_only(source, new + source)
    os.makedirs(new + workdir)
    _mount("tmpfs", new + workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={disk_mb}m,mode=0700,uid={uid},gid={gid}")
    os.mkdir(new + "/proc")
    try:
        _mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        has_proc = True
    except OSError:
        os.rmdir(new + "/proc")
        has_proc = False
    os.mkdir(new + "/.old")
    _check(_syscall("pivot_root", new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", _MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(workdir)
    return has_proc


def top_level(paths: list[str]) -> list[str]:
    """The existing paths of `paths`, real, without those inside another one, parents first.

    >>> top_level(["/usr/lib", "/usr", "/nonexistent", "/usr/bin/env"])
    ['/usr']
    """
    found = sorted({os.path.abspath(p) for p in paths if os.path.lexists(p)})
    kept: list[str] = []
    for path in found:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _bind_read_only(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.islink(src):  # /lib -> usr/lib on merged-/usr systems: the same link
        os.symlink(os.readlink(src), dst)
        return
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        open(dst, "a").close()
    _mount(src, dst, None, _MS_BIND | _MS_REC)
    kept = sum(ms for st, ms in _ST_TO_MS.items() if os.statvfs(dst).f_flag & st)
    try:
        _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | kept)
    except OSError:
        pass  # still read-only to the code: Landlock allows writes only in its working directory


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges(root: bool) -> list[str]:
    """Empty the bounding and ambient capability sets; as root change to nobody; then no capabilities at
    all. The names of what held (``uid``: runs unprivileged, ``caps``: holds no capability)."""
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: no such cap
            break
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    held = []
    if root:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    if os.geteuid() != 0:
        held.append("uid")
    data = (_CapData * 2)()
    if _syscall("capset", ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data) == 0 and no_capabilities():
        held.append("caps")
    return held


def no_capabilities() -> bool:
    """Whether this process's effective, permitted and bounding capability sets are empty (asked of the
    kernel: /proc may not show this process)."""
    data = (_CapData * 2)()
    if _syscall("capget", ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data) != 0:
        return False
    if any(d.effective or d.permitted for d in data):
        return False
    return not any(_libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) == 1 for cap in range(64))
