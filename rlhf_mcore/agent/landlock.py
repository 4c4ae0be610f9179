"""A Landlock rule set for the sandbox process: it reads only what Python needs and writes only in its working
directory, and (Linux >= 6.12) signals nothing outside itself.

Landlock (Linux >= 5.13) lets any process restrict itself without root: after ``landlock_restrict_self``
the kernel refuses (EACCES) every access to a path outside the rules, however the code opens it: reads
beneath `read` paths only (files, directories, execution of mapped libraries), and writes, creates,
removes, renames, truncations and special files beneath `write` paths only. From ABI 6 the domain is also
scoped: signals to processes outside it and connections to abstract unix sockets are refused (EPERM).
Where the kernel has no Landlock, `restrict` returns an empty list and the other layers stand alone.
"""
from __future__ import annotations

import ctypes
import os

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and aarch64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_O_PATH = getattr(os, "O_PATH", 0o10000000)
# LANDLOCK_ACCESS_FS_* bits: EXECUTE (0), WRITE_FILE (1), READ_FILE (2), READ_DIR (3), REMOVE_DIR .. MAKE_SYM
# (4-12) in ABI 1; REFER (13) from ABI 2; TRUNCATE (14) from ABI 3.
_READ = 1 << 0 | 1 << 2 | 1 << 3
_READ_FILE = 1 << 0 | 1 << 2
_ABI1_WRITE = 1 << 1 | sum(1 << bit for bit in range(4, 13))
_WRITE_ACCESS = {1: _ABI1_WRITE, 2: _ABI1_WRITE | 1 << 13, 3: _ABI1_WRITE | 1 << 13 | 1 << 14}
_FILE_ACCESS = 1 << 1 | 1 << 14  # what may be granted on a single file: WRITE_FILE, TRUNCATE
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI (0: none)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0


def restrict(read: list[str], write: list[str]) -> list[str]:
    """Allow reads only beneath `read` + `write` and writes only beneath `write` (directories, or single
    files such as /dev/null), for this process and all it starts; needs ``no_new_privs`` (set here). The
    names of what holds: ``landlock`` (reads and writes) and ``landlock-signals`` (scoped signals)."""
    kernel_abi = abi_version()
    abi = min(kernel_abi, 3)
    if abi == 0:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    handled = _WRITE_ACCESS[abi] | _READ
    scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET if kernel_abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    size = ctypes.sizeof(attr) if scoped else 8  # an older kernel knows only the first field
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return []
    try:
        rules = [(p, _READ) for p in read] + [(p, handled) for p in write]
        for path, access in rules:
            if not os.path.exists(path):
                continue
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    access &= _READ_FILE | _FILE_ACCESS
                rule = _PathBeneath(access, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return []
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return []
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            return []
        return ["landlock"] + (["landlock-signals"] if scoped else [])
    finally:
        os.close(ruleset)
