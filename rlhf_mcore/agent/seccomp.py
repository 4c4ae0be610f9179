"""A seccomp allow-list for the sandbox process: the system calls CPython needs to compute, and EPERM for
every other one.

Installed with ``prctl(PR_SET_NO_NEW_PRIVS)`` + ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``, which any
user may do; it holds for the process and its threads, whatever the code calls through (``os``,
``ctypes``, a C extension), and cannot be removed. Allowed (`ALLOWED`): files, memory, time, threads,
polling, pipes and the process's own identity. Allowed only in part (`RULES`):
- ``clone`` with ``CLONE_THREAD`` (a thread, never a process); ``clone3`` answers ENOSYS so the C library
  falls back to ``clone``, whose flags the filter can read;
- ``kill``/``tgkill`` only at the process itself; ``prlimit64`` and ``sched_setaffinity`` only on itself;
- ``fcntl`` but not ``F_SETOWN``, ``F_SETOWN_EX``, ``F_SETSIG``, ``F_SETLEASE``, ``F_NOTIFY`` (they direct
  signals at a chosen process); ``ioctl`` but not ``TIOCSTI``/``TIOCLINUX`` (typing into a terminal);
  ``prctl`` only to read or set its own name and flags.
Everything else is refused, among it every network family (``socket``, ``socketpair``), ``io_uring_*``,
``fork``/``vfork``/``execve``, ``rt_sigqueueinfo``/``rt_tgsigqueueinfo``/``tkill``, ``pidfd_*``,
``ptrace``, ``process_vm_*``, ``unshare``/``setns``/``mount``, ``mknod``, ``bpf``, ``perf_event_open``,
``keyctl``, ``setuid`` and its kin. Another architecture's calling convention (x32, i386 ``int 0x80``) kills
the process.

Only x86-64 and aarch64 are known; elsewhere `install_filter` returns False (the sandbox reports which
layers hold, and start-up refuses a host that cannot contain the python tool).
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

from rlhf_mcore.agent.syscalls import ARCHES, numbers

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS = 1, 38
_X32_BIT = 0x40000000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data; argument i's low 32 bits at 16 + 8 i (little-endian)

ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "lseek", "close", "close_range", "open", "openat", "openat2", "creat", "stat", "fstat", "lstat",
    "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink", "readlinkat", "getdents",
    "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename",
    "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate",
    "ftruncate", "fsync", "fdatasync", "fallocate", "fadvise64", "flock", "utimensat", "umask", "statfs",
    "fstatfs", "sendfile", "copy_file_range", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
    "flistxattr", "mmap", "munmap", "mprotect", "mremap", "brk", "madvise", "msync", "mincore", "mbind",
    "get_mempolicy", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigsuspend", "sigaltstack", "pause", "futex", "set_robust_list", "get_robust_list", "set_tid_address",
    "rseq", "gettid", "getpid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid",
    "getresgid", "getpgrp", "getpgid", "getsid", "uname", "sysinfo", "times", "getrusage", "getcpu",
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "alarm",
    "getitimer", "setitimer", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "poll", "ppoll", "select", "pselect6", "epoll_create",
    "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "pipe",
    "pipe2", "dup", "dup2", "dup3", "timerfd_create", "timerfd_settime", "timerfd_gettime", "getrandom",
    "memfd_create", "membarrier", "arch_prctl", "exit", "exit_group", "wait4", "waitid", "restart_syscall",
    "getrlimit", "setrlimit",
)
_CLONE_THREAD = 0x00010000
_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETLEASE, _F_NOTIFY = 8, 10, 15, 1024, 1026
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_PRCTL_OK = (3, 15, 16, 21, 23, 38, 39)  # GET_DUMPABLE, SET/GET_NAME, GET_SECCOMP, CAPBSET_READ, (GET_)NO_NEW_PRIVS
SELF = "self"  # stands for the process's own pid in a rule's values


# name: (argument, values, allowed when the argument is one of them (True) or when it is none of them (False))
RULES = {
    "kill": (0, (SELF,), True),
    "tgkill": (0, (SELF,), True),
    "prlimit64": (0, (0, SELF), True),
    "sched_setaffinity": (0, (0, SELF), True),
    "fcntl": (1, (_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETLEASE, _F_NOTIFY), False),
    "ioctl": (1, (_TIOCSTI, _TIOCLINUX), False),
    "prctl": (0, _PRCTL_OK, True),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _arg_rule(nr: int, arg: int, values: list[int], allow_if_in: bool) -> list[bytes]:
    """``if nr == NR: return ALLOW/EPERM by whether arg is among values`` (else fall through)."""
    matched, unmatched = (_RET_ALLOW, _RET_ERRNO | _EPERM) if allow_if_in else (_RET_ERRNO | _EPERM, _RET_ALLOW)
    chain = [_insn(_JEQ_K, len(values) - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(values)]
    body = [_insn(_LD_W_ABS, 0, 0, 16 + 8 * arg), *chain, _insn(_RET_K, 0, 0, unmatched),
            _insn(_RET_K, 0, 0, matched)]
    return [_insn(_JEQ_K, 0, len(body), nr), *body]


def build_filter(arch: str, pid: int) -> bytes:
    """The BPF program (struct sock_filter array) for `arch` and the process `pid`; KeyError for an
    unknown arch."""
    nrs, audit_arch = numbers(arch), ARCHES[arch][1]
    prog = [_insn(_LD_W_ABS, 0, 0, _OFF_ARCH), _insn(_JEQ_K, 1, 0, audit_arch), _insn(_RET_K, 0, 0, _RET_KILL),
            _insn(_LD_W_ABS, 0, 0, _OFF_NR)]
    if arch == "x86_64":  # the x32 ABI shares the arch value: its numbers carry bit 30
        prog += [_insn(_JGE_K, 0, 1, _X32_BIT), _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    for name in ALLOWED:
        if name in nrs:
            prog += [_insn(_JEQ_K, 0, 1, nrs[name]), _insn(_RET_K, 0, 0, _RET_ALLOW)]
    prog += [_insn(_JEQ_K, 0, 1, nrs["clone3"]), _insn(_RET_K, 0, 0, _RET_ERRNO | _ENOSYS)]
    prog += [_insn(_JEQ_K, 0, 4, nrs["clone"]), _insn(_LD_W_ABS, 0, 0, 16),  # clone's flags: a thread or EPERM
             _insn(_JSET_K, 0, 1, _CLONE_THREAD), _insn(_RET_K, 0, 0, _RET_ALLOW),
             _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    for name, (arg, values, allow_if_in) in RULES.items():
        prog += _arg_rule(nrs[name], arg, [pid if v == SELF else v for v in values], allow_if_in)
    prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    return b"".join(prog)


class _FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter() -> bool:
    """Install the filter in this process; False where it cannot be (unknown arch, no seccomp)."""
    arch = platform.machine()
    if arch not in ARCHES:
        return False
    code = build_filter(arch, os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _FProg(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0
    except (OSError, AttributeError):
        return False
