"""Syscall numbers the sandbox needs by name: name -> (x86-64, aarch64), None where the arch has no such call
(aarch64 has only the *at forms and no legacy calls). Taken from the kernel's uapi headers
(asm/unistd_64.h for x86-64, asm-generic/unistd.h for aarch64); the numbers are ABI and never change.

>>> NUMBERS["openat"], NUMBERS["open"]
((257, 56), (2, None))
"""
from __future__ import annotations

ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # machine: (column, AUDIT_ARCH_*)

NUMBERS: dict[str, tuple[int | None, int | None]] = {
    "read": (0, 63), "write": (1, 64), "readv": (19, 65), "writev": (20, 66), "pread64": (17, 67),
    "pwrite64": (18, 68), "preadv": (295, 69), "pwritev": (296, 70), "preadv2": (327, 286), "pwritev2": (328, 287),
    "lseek": (8, 62), "close": (3, 57), "close_range": (436, 436), "open": (2, None), "openat": (257, 56),
    "openat2": (437, 437), "creat": (85, None), "stat": (4, None), "fstat": (5, 80), "lstat": (6, None),
    "newfstatat": (262, 79), "statx": (332, 291), "access": (21, None), "faccessat": (269, 48),
    "faccessat2": (439, 439), "readlink": (89, None), "readlinkat": (267, 78), "getdents": (78, None),
    "getdents64": (217, 61), "getcwd": (79, 17), "chdir": (80, 49), "fchdir": (81, 50), "mkdir": (83, None),
    "mkdirat": (258, 34), "rmdir": (84, None), "unlink": (87, None), "unlinkat": (263, 35), "rename": (82, None),
    "renameat": (264, 38), "renameat2": (316, 276), "link": (86, None), "linkat": (265, 37), "symlink": (88, None),
    "symlinkat": (266, 36), "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "truncate": (76, 45),
    "ftruncate": (77, 46), "fsync": (74, 82), "fdatasync": (75, 83), "fallocate": (285, 47),
    "fadvise64": (221, 223), "flock": (73, 32), "utimensat": (280, 88), "umask": (95, 166), "statfs": (137, 43),
    "fstatfs": (138, 44), "sendfile": (40, 71), "copy_file_range": (326, 285), "getxattr": (191, 8),
    "lgetxattr": (192, 9), "fgetxattr": (193, 10), "listxattr": (194, 11), "llistxattr": (195, 12),
    "flistxattr": (196, 13), "mmap": (9, 222), "munmap": (11, 215), "mprotect": (10, 226), "mremap": (25, 216),
    "brk": (12, 214), "madvise": (28, 233), "msync": (26, 227), "mincore": (27, 232), "mbind": (237, 235),
    "get_mempolicy": (239, 236), "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139),
    "rt_sigpending": (127, 136), "rt_sigtimedwait": (128, 137), "rt_sigsuspend": (130, 133),
    "sigaltstack": (131, 132), "pause": (34, None), "futex": (202, 98), "set_robust_list": (273, 99),
    "get_robust_list": (274, 100), "set_tid_address": (218, 96), "rseq": (334, 293), "gettid": (186, 178),
    "getpid": (39, 172), "getppid": (110, 173), "getuid": (102, 174), "geteuid": (107, 175), "getgid": (104, 176),
    "getegid": (108, 177), "getgroups": (115, 158), "getresuid": (118, 148), "getresgid": (120, 150),
    "getpgrp": (111, None), "getpgid": (121, 155), "getsid": (124, 156), "uname": (63, 160), "sysinfo": (99, 179),
    "times": (100, 153), "getrusage": (98, 165), "getcpu": (309, 168), "clock_gettime": (228, 113),
    "clock_getres": (229, 114), "clock_nanosleep": (230, 115), "nanosleep": (35, 101), "gettimeofday": (96, 169),
    "time": (201, None), "alarm": (37, None), "getitimer": (36, 102), "setitimer": (38, 103),
    "sched_yield": (24, 124), "sched_getaffinity": (204, 123), "sched_getparam": (143, 121),
    "sched_getscheduler": (145, 120), "sched_get_priority_max": (146, 125), "sched_get_priority_min": (147, 126),
    "poll": (7, None), "ppoll": (271, 73), "select": (23, None), "pselect6": (270, 72), "epoll_create": (213, None),
    "epoll_create1": (291, 20), "epoll_ctl": (233, 21), "epoll_wait": (232, None), "epoll_pwait": (281, 22),
    "epoll_pwait2": (441, 441), "eventfd": (284, None), "eventfd2": (290, 19), "pipe": (22, None),
    "pipe2": (293, 59), "dup": (32, 23), "dup2": (33, None), "dup3": (292, 24), "timerfd_create": (283, 85),
    "timerfd_settime": (286, 86), "timerfd_gettime": (287, 87), "getrandom": (318, 278), "memfd_create": (319, 279),
    "membarrier": (324, 283), "arch_prctl": (158, None), "exit": (60, 93), "exit_group": (231, 94),
    "wait4": (61, 260), "waitid": (247, 95), "restart_syscall": (219, 128), "getrlimit": (97, 163),
    "setrlimit": (160, 164), "clone": (56, 220), "clone3": (435, 435), "kill": (62, 129), "tgkill": (234, 131),
    "fcntl": (72, 25), "prlimit64": (302, 261), "sched_setaffinity": (203, 122), "ioctl": (16, 29),
    "prctl": (157, 167), "unshare": (272, 97), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "capset": (126, 91), "capget": (125, 90), "setns": (308, 268),
}


def numbers(arch: str) -> dict[str, int]:
    """name -> number on `arch` (a key of ARCHES), the calls it lacks left out."""
    column = ARCHES[arch][0]
    return {name: nrs[column] for name, nrs in NUMBERS.items() if nrs[column] is not None}
