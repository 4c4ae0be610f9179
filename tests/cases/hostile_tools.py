"""`python -m tests.worker hostile_tools`: the python tool under hostile code, one row per attack, as the
trainer runs it (a ToolExecutor in this process, whatever user runs it).

Every row's code runs in one call; then, whatever the row, the harness checks what a contained call leaves:
- no secret reached the result: not the trainer's environment (HF_TOKEN, given to this process at launch),
  not ~/.netrc, not a file of the run directory;
- a victim process of the same user is alive with its limits unchanged, and so is this process;
- the canary file of the run directory is unchanged, and nothing connected to the TCP or unix listeners;
- the call's working directory is gone (TMPDIR holds nothing), no process the call started is left (this
  process is a child subreaper: anything orphaned would come to it), and the call took at most its time-out
  plus 1.5 s;
- the result is at most max_tool_response_chars characters, and this process's peak memory stays < 1 GB.
Each row also names what its result must show (a regex): the refusal it expects. One JSON line per row:
{"row", "category", "ok", "problems", "error", "text"}, then {"layers": [...]}.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.launch import SandboxLimits, run_sandboxed
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import load_tools

SECRET = "hf_SECRET_do_not_leak_4242"
TIMEOUT_S, MAX_CHARS, DISK_MB = 3.0, 2000, 16
EPERM = r"^-1 1\s*$"  # a ctypes call's "result errno" line when seccomp refuses it
REFUSED = r"(PermissionError|Operation not permitted|Permission denied|FileNotFoundError|No such file)"
# syscalls the rows call through ctypes that the filter's own table does not name
NRS = {"x86_64": {"io_uring_setup": 425, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "tkill": 200,
                  "tgkill": 234, "pidfd_open": 434, "ptrace": 101, "process_vm_readv": 310, "mknodat": 259,
                  "mount": 165, "unshare": 272, "bpf": 321, "perf_event_open": 298, "keyctl": 250, "clone": 56,
                  "clone3": 435, "socket": 41, "socketpair": 53, "prlimit64": 302, "setns": 308, "chroot": 161,
                  "vfork": 58},
       "aarch64": {"io_uring_setup": 425, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "tkill": 130,
                   "tgkill": 131, "pidfd_open": 434, "ptrace": 117, "process_vm_readv": 270, "mknodat": 33,
                   "mount": 40, "unshare": 97, "bpf": 280, "perf_event_open": 241, "keyctl": 219, "clone": 220,
                   "clone3": 435, "socket": 198, "socketpair": 199, "prlimit64": 261, "setns": 268, "chroot": 51,
                   "vfork": 220}}
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def sys_row(call: str, buffer: int = 0) -> str:
    """Code that makes one raw syscall through ctypes and prints "result errno"; `buffer` > 0 first makes a
    zeroed buffer of that many bytes, named `buf`, for the call's struct argument."""
    made = f"buf = ctypes.create_string_buffer({buffer})\n" if buffer else ""
    return LIBC + made + f"r = libc.syscall({call})\nprint(r, ctypes.get_errno())"


# (category, name, code, regex its result text must match); {placeholders} are filled per run
ROWS = [
    # files and secrets
    ("files", "parent_environ", "print(open('/proc/{driver}/environ', 'rb').read())", REFUSED),
    ("files", "every_environ", "import glob\nfor p in glob.glob('/proc/*/environ'):\n    try:\n"
     "        print(open(p, 'rb').read())\n    except OSError as e:\n        print(p, e)", ""),
    ("files", "own_environ", "import os\nprint(dict(os.environ))", "HOME"),
    ("files", "netrc", "print(open('{home}/.netrc').read())", REFUSED),
    ("files", "home_listing", "import os\nprint(os.listdir('{home}'))", REFUSED),
    ("files", "run_dir_file", "print(open('{secret_path}').read())", REFUSED),
    ("files", "etc_passwd", "print(open('/etc/passwd').read())", REFUSED),
    ("files", "etc_shadow", "print(open('/etc/shadow').read())", REFUSED),
    ("files", "symlink_escape", "import os\nos.symlink('{run_dir}', 'x')\nprint(open('x/secret.txt').read())", REFUSED),
    ("files", "write_canary", "import _io\n_io.FileIO('{canary}', 'w').write(b'pwned')", REFUSED),
    ("files", "write_outside", "import _io\n_io.FileIO('{run_dir}/new.txt', 'w').write(b'x')", REFUSED),
    ("files", "proc_root_of_parent", "import os\nprint(os.listdir('/proc/{driver}/root'))", REFUSED),
    # network by every route
    ("network", "tcp_connect", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", REFUSED),
    ("network", "raw_socket_module", "import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))",
     REFUSED),
    ("network", "ctypes_socket", sys_row("{nr[socket]}, 2, 1, 0"), EPERM),
    ("network", "unix_socket", sys_row("{nr[socket]}, 1, 1, 0"), EPERM),
    ("network", "socketpair", LIBC + "fds = (ctypes.c_int * 2)()\nr = libc.syscall({nr[socketpair]}, 1, 1, 0, fds)\n"
     "print(r, ctypes.get_errno())", EPERM),
    ("network", "raw_icmp", sys_row("{nr[socket]}, 2, 3, 1"), EPERM),
    ("network", "packet", sys_row("{nr[socket]}, 17, 3, 0"), EPERM),
    ("network", "netlink", sys_row("{nr[socket]}, 16, 3, 0"), EPERM),
    ("network", "io_uring", sys_row("{nr[io_uring_setup]}, 8, buf", buffer=120), EPERM),
    # fork and clone by every route
    ("processes", "os_fork", "import os\nos.fork()", REFUSED),
    ("processes", "ctypes_fork", LIBC + "r = libc.fork()\nprint(r, ctypes.get_errno())", EPERM),
    ("processes", "clone_process", sys_row("{nr[clone]}, 17, 0, 0, 0, 0"), EPERM),
    ("processes", "clone3", sys_row("{nr[clone3]}, 0, 0"), r"^-1 (1|38)\s*$"),
    ("processes", "execve", LIBC + "argv = (ctypes.c_char_p * 2)(b'/bin/sh', None)\n"
     "r = libc.execv(b'/bin/sh', argv)\nprint(r, ctypes.get_errno())", r"^-1 (1|2)\s*$"),
    ("processes", "subprocess", "import subprocess\nsubprocess.run(['true'])", REFUSED),
    ("processes", "posixsubprocess", "import _posixsubprocess, os\nr, w = os.pipe()\n"
     "_posixsubprocess.fork_exec([b'/bin/true'], [b'/bin/true'], True, (), None, None, -1, -1, -1, -1, -1, -1, "
     "r, w, False, False, False, None, None, None, -1, None, False)", r"(PermissionError|Error)"),
    ("processes", "multiprocessing", "import multiprocessing as mp\np = mp.Process(target=print)\np.start()",
     REFUSED),
    # signals and limits aimed at other processes
    ("signals", "kill_victim", "import os\nos.kill({victim}, 9)", REFUSED),
    ("signals", "kill_trainer", "import os\nos.kill({driver}, 15)", REFUSED),
    ("signals", "kill_parent", "import os\nos.kill(os.getppid(), 9)", REFUSED),
    ("signals", "kill_everyone", "import os\nos.kill(-1, 9)", REFUSED),
    ("signals", "kill_group", "import os\nos.kill(0, 15)", REFUSED),
    ("signals", "sigqueueinfo", sys_row("{nr[rt_sigqueueinfo]}, {victim}, 9, buf", buffer=128), EPERM),
    ("signals", "tgsigqueueinfo", sys_row("{nr[rt_tgsigqueueinfo]}, {victim}, {victim}, 9, buf", buffer=128), EPERM),
    ("signals", "tkill", sys_row("{nr[tkill]}, {victim}, 9"), EPERM),
    ("signals", "tgkill", sys_row("{nr[tgkill]}, {victim}, {victim}, 9"), EPERM),
    ("signals", "pidfd", sys_row("{nr[pidfd_open]}, {victim}, 0"), EPERM),
    ("signals", "fcntl_setsig", LIBC + "import os\nr, w = os.pipe()\nx = libc.fcntl(r, 10, 9)\n"
     "print(x, ctypes.get_errno())", EPERM),
    ("signals", "fcntl_setown", LIBC + "import os\nr, w = os.pipe()\nx = libc.fcntl(r, 8, {victim})\n"
     "print(x, ctypes.get_errno())", EPERM),
    ("signals", "prlimit_victim", "import resource\nresource.prlimit({victim}, resource.RLIMIT_NOFILE, (3, 3))",
     REFUSED),
    ("signals", "prlimit_trainer", LIBC + "lim = (ctypes.c_uint64 * 2)(3, 3)\n"
     "r = libc.syscall({nr[prlimit64]}, {driver}, 7, lim, None)\nprint(r, ctypes.get_errno())", EPERM),
    ("signals", "setpriority", "import os\nos.setpriority(os.PRIO_PROCESS, {victim}, 19)", REFUSED),
    ("signals", "ptrace", sys_row("{nr[ptrace]}, 16, {victim}, 0, 0"), EPERM),
    ("signals", "process_vm_readv", sys_row("{nr[process_vm_readv]}, {victim}, 0, 0, 0, 0, 0"), EPERM),
    ("signals", "affinity", "import os\nos.sched_setaffinity({victim}, {{0}})", REFUSED),
    # privileges
    ("privileges", "mknod_kmsg", "import os, stat\nos.mknod('kmsg', stat.S_IFCHR | 0o600, os.makedev(1, 11))",
     REFUSED),
    ("privileges", "mknodat", sys_row("{nr[mknodat]}, -100, b'kmsg', 0o20600, 0x10b"), EPERM),
    ("privileges", "dev_kmsg", "open('/dev/kmsg', 'w').write('pwned')", REFUSED),
    ("privileges", "mount", sys_row("{nr[mount]}, b'none', b'.', b'tmpfs', 0, None"), EPERM),
    ("privileges", "unshare", sys_row("{nr[unshare]}, 0x10000000"), EPERM),
    ("privileges", "setns", sys_row("{nr[setns]}, 0, 0"), EPERM),
    ("privileges", "chroot", sys_row("{nr[chroot]}, b'.'"), EPERM),
    ("privileges", "setuid_root", "import os\nos.setuid(0)", REFUSED),
    ("privileges", "bpf", sys_row("{nr[bpf]}, 0, 0, 0"), EPERM),
    ("privileges", "perf_event_open", sys_row("{nr[perf_event_open]}, 0, 0, -1, -1, 0"), EPERM),
    ("privileges", "keyctl", sys_row("{nr[keyctl]}, 0, 0, 0, 0, 0"), EPERM),
    ("privileges", "capabilities", "print([l for l in open('/proc/self/status') if l.startswith('Cap')])",
     r"CapEff:\\t0000000000000000"),
    ("privileges", "uid", "import os\nprint(os.getuid(), os.geteuid())", r"^[1-9]\d* [1-9]\d*\s*$"),
    # resource bombs
    ("bombs", "memory", "x = bytearray(8 * 1024 ** 3)", r"MemoryError|memory limit"),
    ("bombs", "threads", "import threading, time\nts = []\nfor i in range(100000):\n"
     "    t = threading.Thread(target=time.sleep, args=(60,), daemon=True)\n    t.start()\n    ts.append(t)",
     r"(RuntimeError|MemoryError|can't start new thread|killed)"),
    ("bombs", "files", "fs = [open('/dev/null') for _ in range(100000)]", r"Too many open files"),
    ("bombs", "disk", "n = 0\ntry:\n    for i in range(1000):\n        with open(f'f{{i}}', 'wb') as f:\n"
     "            for _ in range(8):\n                f.write(b'x' * (1 << 20))\n                n += 1\n"
     "except OSError as e:\n    print(n, 'MB', e)", r"No space left|File too large"),
    ("bombs", "cpu", "while True:\n    pass", r"time-out"),
    ("bombs", "fork_bomb", "import os\nwhile True:\n    os.fork()", REFUSED),
    # output bombs
    ("output", "print_flood", "while True:\n    print('x' * 1000)", r"characters cut"),
    ("output", "huge_exception", "raise ValueError('x' * 3_000_000)", r"characters cut"),
    ("output", "status_pipe_flood", "import os\nfor fd in range(3, 64):\n    try:\n"
     "        os.write(fd, b'{{\"status\": \"ok\", \"value\": \"' + b'x' * (64 << 20))\n    except OSError:\n"
     "        pass", r"result is longer than|characters cut|^$"),
    # leftovers
    ("leftovers", "chmod_zero_dir", "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0)\n"
     "os.chmod('a', 0)\nprint('done')", r"done"),
    ("leftovers", "immutable_file", LIBC + "import fcntl, os, struct\nfd = os.open('f', os.O_CREAT | os.O_RDONLY)\n"
     "try:\n    fcntl.ioctl(fd, 0x40086602, struct.pack('l', 0x10))\nexcept OSError as e:\n    print(e)\n"
     "print('done')", r"done"),
    ("leftovers", "background_thread", "import threading, time\ndef spin():\n    while True:\n"
     "        open('spin', 'a').write('x')\n        time.sleep(0.01)\n"
     "threading.Thread(target=spin, daemon=False).start()\nprint('started')", r"started"),
    ("leftovers", "sleeping_thread", "import threading, time\n"
     "threading.Thread(target=time.sleep, args=(600,)).start()\nprint('started')", r"started"),
]

# custom tools whose return value is the bomb (the python tool returns what it prints)
TOOLS_FILE = '''
from rlhf_mcore.agent.tools import tool


NONE = {"type": "object", "properties": {}}


@tool("long_value", "returns a long value", NONE)
def long_value(arguments, context):
    return "x" * 3_000_000


@tool("long_value_in_process", "returns a long value in the trainer", NONE, sandboxed=False)
def long_value_in_process(arguments, context):
    return "y" * 3_000_000
'''
TOOL_ROWS = [("output", "return_value", "long_value", r"characters cut"),
             ("output", "return_value_in_process", "long_value_in_process", r"characters cut")]


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if entry.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found


def limits(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        return f.read()


class Harness:
    def __init__(self, root: Path):
        self.run_dir, self.home, self.tmp = root / "run", Path(os.environ["HOME"]), Path(os.environ["TMPDIR"])
        self.run_dir.mkdir()
        (self.run_dir / "secret.txt").write_text(SECRET)
        (self.home / ".netrc").write_text(f"machine huggingface.co login me password {SECRET}\n")
        self.canary = self.run_dir / "canary.txt"
        self.canary.write_text("keep")
        self.victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp.setblocking(False)
        self.unix_path = str(root / "listener.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen(1)
        self.unix.setblocking(False)
        machine = platform.machine()
        self.fill = {"driver": os.getpid(), "victim": self.victim.pid, "home": str(self.home),
                     "run_dir": str(self.run_dir), "secret_path": str(self.run_dir / "secret.txt"),
                     "canary": str(self.canary), "port": self.tcp.getsockname()[1], "nr": NRS.get(machine, {})}

    def problems(self, result, limits_before: tuple[str, str]) -> list[str]:
        found = []
        if SECRET in result.text:
            found.append("a secret reached the result")
        if self.victim.poll() is not None:
            found.append(f"the victim died (rc {self.victim.returncode})")
        if (limits(self.victim.pid), limits(os.getpid())) != limits_before:
            found.append("the victim's or the trainer's limits changed")
        if self.canary.read_text() != "keep" or sorted(p.name for p in self.run_dir.iterdir()) != [
                "canary.txt", "secret.txt"]:
            found.append("the run directory changed")
        for listener in (self.tcp, self.unix):
            try:
                listener.accept()[0].close()
                found.append(f"something connected to the {listener.family.name} listener")
            except BlockingIOError:
                pass
        if result.seconds > TIMEOUT_S + 1.5:
            found.append(f"the call took {result.seconds:.1f} s against a time-out of {TIMEOUT_S:g} s")
        if len(result.text) > MAX_CHARS:
            found.append(f"the result is {len(result.text)} characters (max {MAX_CHARS})")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and (self.left() or list(self.tmp.iterdir())):
            time.sleep(0.05)
        if self.left():
            found.append(f"processes left: {self.left()}")
        if list(self.tmp.iterdir()):
            found.append(f"left in TMPDIR: {[p.name for p in self.tmp.iterdir()]}")
        return found

    def left(self) -> list[int]:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap orphans handed to this subreaper
                pass
        except ChildProcessError:
            pass
        return [p for p in children(os.getpid()) if p != self.victim.pid]


def check(harness: Harness, ex: ToolExecutor, category: str, name: str, call: ToolCall, expect: str) -> dict:
    before = (limits(harness.victim.pid), limits(os.getpid()))
    result = ex.run([call])[0]
    problems = harness.problems(result, before)
    if expect and not re.search(expect, result.text, re.MULTILINE):
        problems.append(f"the result does not show {expect!r}")
    return {"row": name, "category": category, "ok": not problems, "problems": problems, "error": result.error,
            "text": result.text[-300:]}


def entry(argv: list[str]) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    signal.signal(signal.SIGTERM, lambda *a: print(json.dumps({"row": "SIGTERM", "ok": False}), flush=True))
    only = set(argv)
    with tempfile.TemporaryDirectory(dir=os.environ["HOME"]) as root:  # TMPDIR stays for the calls alone
        harness = Harness(Path(root))
        tools_file = Path(root) / "tools.py"
        tools_file.write_text(TOOLS_FILE)
        tools = load_tools(["python", "long_value", "long_value_in_process"], str(tools_file))
        rows = [(c, n, ToolCall("python", {"code": textwrap.dedent(code).format(**harness.fill)}), e)
                for c, n, code, e in ROWS]
        rows += [(c, n, ToolCall(tool, {}), e) for c, n, tool, e in TOOL_ROWS]
        try:
            with ToolExecutor(tools, timeout_s=TIMEOUT_S, max_output_chars=MAX_CHARS, memory_mb=1024, workers=1,
                              disk_mb=DISK_MB) as ex:
                for category, name, call, expect in rows:
                    if not only or name in only:
                        print(json.dumps(check(harness, ex, category, name, call, expect)), flush=True)
        finally:
            harness.victim.kill()
            harness.victim.wait()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    layers = run_sandboxed("rlhf_mcore.agent.python_tool:run_python", "python", {"code": "pass"}, {},
                           SandboxLimits(timeout_s=10)).layers
    print(json.dumps({"layers": layers, "peak_mb": peak_mb, "uid": os.getuid()}), flush=True)
    return 0
