"""A Landlock rule set for the sandbox process: the file system is read-only except its working directory.

Landlock (Linux >= 5.13) lets any process restrict itself without root: after
``landlock_restrict_self`` the kernel refuses (EACCES) every write, create, remove, rename, truncate or
special-file creation under ``/`` outside the directories given here, however the code opens the file.
Reads stay possible, so imports work. Where the kernel has no Landlock, `restrict_writes` returns False
and the sandbox keeps only its Python-level `guards`.
"""
from __future__ import annotations

import ctypes
import os

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and aarch64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_O_PATH = getattr(os, "O_PATH", 0o10000000)
# LANDLOCK_ACCESS_FS_* bits: WRITE_FILE (1), REMOVE_DIR .. MAKE_SYM (4-12) in ABI 1; REFER (13) from ABI 2;
# TRUNCATE (14) from ABI 3. EXECUTE (0), READ_FILE (2) and READ_DIR (3) are not handled: reads stay allowed.
_ABI1_WRITE = 1 << 1 | sum(1 << bit for bit in range(4, 13))
_WRITE_ACCESS = {1: _ABI1_WRITE, 2: _ABI1_WRITE | 1 << 13, 3: _ABI1_WRITE | 1 << 13 | 1 << 14}
_FILE_ACCESS = 1 << 1 | 1 << 14  # what may be granted on a single file: WRITE_FILE, TRUNCATE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


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


def restrict_writes(writable: list[str]) -> bool:
    """Allow writes only beneath `writable` (directories, or single files such as /dev/null), for this
    process and all it starts; needs ``no_new_privs`` (set here). False when Landlock is unavailable."""
    abi = min(abi_version(), 3)
    if abi == 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    handled = _WRITE_ACCESS[abi]
    attr = _RulesetAttr(handled)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        return False
    try:
        for path in writable:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
            try:
                access = handled if os.path.isdir(path) else handled & _FILE_ACCESS
                rule = _PathBeneath(access, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return False
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return False
        return libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)
