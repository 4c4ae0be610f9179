"""A seccomp filter for the sandbox process: no new processes, no program execution, no sockets.

Installed with ``prctl(PR_SET_NO_NEW_PRIVS)`` + ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``, which any
user may do (no root). The kernel then answers EPERM to ``fork``, ``vfork``, ``clone`` without
``CLONE_THREAD`` (a process, not a thread), ``execve``/``execveat``, ``socket``/``socketpair``, ``ptrace``,
``process_vm_readv``/``writev``, ``pidfd_send_signal`` and ``tkill``, and ``kill``/``tgkill`` aimed at another
process (signals to itself stay allowed), whatever the code calls them through (``os.fork``,
``subprocess``, ``os.kill``, ``ctypes``, a C extension). ``clone3`` answers
ENOSYS, so the C library falls back to ``clone``, whose flags the filter can read (threads stay possible).
The filter holds for the process and anything it could still start; it cannot be removed.

Only x86-64 and aarch64 are known; elsewhere `install_filter` returns False and the sandbox relies on its
Python-level guards alone.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JSET|K, BPF_RET|K
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (arg0's low 32 bits on little-endian)
# arch: (AUDIT_ARCH, {syscall: number}); aarch64 has no fork/vfork syscalls
_ARCHES = {
    "x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "socket": 41,
                            "socketpair": 53, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                            "pidfd_send_signal": 424, "tkill": 200, "clone": 56, "clone3": 435, "kill": 62,
                            "tgkill": 234}),
    "aarch64": (0xC00000B7, {"execve": 221, "execveat": 281, "socket": 198, "socketpair": 199, "ptrace": 117,
                             "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_send_signal": 424,
                             "tkill": 130, "clone": 220, "clone3": 435, "kill": 129, "tgkill": 131}),
}
DENIED = ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "ptrace", "process_vm_readv",
          "process_vm_writev", "pidfd_send_signal", "tkill")


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(arch: str, pid: int) -> bytes:
    """The BPF program (struct sock_filter array) for `arch` and the process `pid`; KeyError for an
    unknown arch."""
    audit_arch, nrs = _ARCHES[arch]
    prog = [_insn(_LD_W_ABS, 0, 0, _OFF_ARCH), _insn(_JEQ_K, 1, 0, audit_arch), _insn(_RET_K, 0, 0, _RET_KILL),
            _insn(_LD_W_ABS, 0, 0, _OFF_NR)]
    for name in DENIED:
        if name in nrs:
            prog += [_insn(_JEQ_K, 0, 1, nrs[name]), _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    prog += [_insn(_JEQ_K, 0, 1, nrs["clone3"]), _insn(_RET_K, 0, 0, _RET_ERRNO | _ENOSYS)]
    # clone: allowed only with CLONE_THREAD in its flags (arg0)
    prog += [_insn(_JEQ_K, 0, 3, nrs["clone"]), _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
             _insn(_JSET_K, 1, 0, _CLONE_THREAD), _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    # kill(pid, sig): only to itself (pid, 0 = its own process group, -pid); tgkill(tgid, ...): only tgid == pid
    prog += [_insn(_JEQ_K, 0, 6, nrs["kill"]), _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
             _insn(_JEQ_K, 3, 0, pid), _insn(_JEQ_K, 2, 0, 0), _insn(_JEQ_K, 1, 0, -pid & 0xFFFFFFFF),
             _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM), _insn(_RET_K, 0, 0, _RET_ALLOW)]
    prog += [_insn(_JEQ_K, 0, 3, nrs["tgkill"]), _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
             _insn(_JEQ_K, 1, 0, pid), _insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(prog)


class _FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter() -> bool:
    """Install the filter in this process; False where it cannot be (unknown arch, no seccomp)."""
    arch = platform.machine()
    if arch not in _ARCHES:
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
