"""Python-level guards a sandbox process installs before it runs a tool: no sockets, no new processes,
no writes outside its working directory.

They replace the functions code normally reaches for (``socket.socket``, ``socket.create_connection``,
``os.fork``, ``os.system``, ``subprocess.Popen``, ``open`` for writing, ``os.remove``...) with ones that
raise ``PermissionError`` naming the sandbox rule, so the model reads why its call failed. They are
not a security boundary by themselves: code can reach the originals (``ctypes``, ``_io.FileIO``,
``posix``). The kernel-level layers under them are `seccomp` (processes, programs, sockets) and
`landlock` (writes); the sandbox reports which layers hold.
"""
from __future__ import annotations

import builtins
import functools
import io
import os

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PROCESS_FUNCS = ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve",
                  "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl",
                  "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe")
_PATH_FUNCS = ("remove", "unlink", "rmdir", "mkdir", "chmod", "chown", "truncate", "utime", "mkfifo", "mknod")
_TWO_PATH_FUNCS = ("rename", "replace", "link", "symlink")
_ALWAYS_WRITABLE = ("/dev/null",)


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the tool sandbox")
    return refused


def block_network() -> None:
    import socket

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the tool sandbox")

    socket.socket = NoSocket
    for name in ("create_connection", "create_server", "socketpair", "getaddrinfo", "gethostbyname", "fromfd"):
        setattr(socket, name, _refuse(f"socket.{name} (network access)"))


def block_processes() -> None:
    import subprocess

    for name in _PROCESS_FUNCS:
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name} (starting processes)"))
    subprocess.Popen.__init__ = _refuse("subprocess (starting processes)")


def inside(path, root: str, dir_fd: int | None = None) -> bool:
    """Whether `path` (resolved, symlinks followed) lies in the directory `root` (already resolved)."""
    if isinstance(path, int):  # an open descriptor: it was checked when it was opened
        return True
    path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    real = os.path.realpath(path)
    return real in _ALWAYS_WRITABLE or real == root or real.startswith(root + os.sep)


def confine_writes(root: str) -> None:
    """Opening for writing, creating, removing or renaming a path outside `root` raises PermissionError."""
    root = os.path.realpath(root)

    def check(path, dir_fd=None):
        if not inside(path, root, dir_fd):
            raise PermissionError(f"writing outside the sandbox's working directory is refused: {path!r}")

    real_open, real_os_open = builtins.open, os.open

    @functools.wraps(real_open)
    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            check(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & _WRITE_FLAGS:
            check(path, dir_fd)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    builtins.open = io.open = open_
    os.open = os_open
    for name in _PATH_FUNCS:
        setattr(os, name, _checked(getattr(os, name), check, 1))
    for name in _TWO_PATH_FUNCS:
        setattr(os, name, _checked(getattr(os, name), check, 2))


def _checked(fn, check, num_paths: int):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for path in args[:num_paths]:
            check(path, kwargs.get("dir_fd") or kwargs.get("src_dir_fd"))
        return fn(*args, **kwargs)
    return wrapper
