"""Whether this host can contain sandboxed tools, asked once per process by running one call.

A sandbox holds when its code runs unprivileged (``uid``), under the seccomp allow-list (``seccomp``), and
sees only what Python needs: a private root in its own mount and PID namespaces (``mount``, ``pid``) or,
where namespaces are refused, Landlock read rules (``landlock``). `gaps` names what is missing; start-up
refuses sandboxed tools on such a host unless ``rollout.multi_turn.allow_weak_sandbox=true``.

>>> gaps(["mount", "pid", "uid", "caps", "seccomp"])
[]
>>> gaps(["landlock", "seccomp"])
['an unprivileged uid (uid 65534 for a root trainer)']
"""
from __future__ import annotations

import functools

from rlhf_mcore.agent.launch import Finished, SandboxLimits, run_sandboxed

NEEDS = (
    (lambda held: "uid" in held, "an unprivileged uid (uid 65534 for a root trainer)"),
    (lambda held: "seccomp" in held, "the seccomp allow-list (Linux on x86-64 or aarch64)"),
    (lambda held: {"mount", "pid"} <= held or "landlock" in held,
     "a private root (mount and PID namespaces: kernel.unprivileged_userns_clone=1 / user.max_user_namespaces "
     "> 0 for a non-root trainer) or Landlock read rules (Linux >= 5.13)"),
)
PROBE = "import json, decimal\nprint('contained')"


def gaps(layers: list[str]) -> list[str]:
    """What a sandbox that reported `layers` lacks to contain model-written code."""
    held = set(layers)
    return [what for holds, what in NEEDS if not holds(held)]


@functools.lru_cache(maxsize=1)
def probe() -> Finished:
    """One python-tool call on this host (cached): its layers, or why it could not run."""
    return run_sandboxed("rlhf_mcore.agent.python_tool:run_python", "python", {"code": PROBE}, {},
                         SandboxLimits(timeout_s=30))


def containment_errors(tool_names: list[str], allow_weak: bool) -> list[str]:
    """One line when sandboxed tools `tool_names` cannot be contained here (empty: they can, or none)."""
    if not tool_names:
        return []
    done = probe()
    if done.status != "ok" or done.output.strip() != "contained":
        why = done.error or (done.output.strip().splitlines() or ["no output"])[-1]
        return [f"rollout.multi_turn.tools: the sandbox of the {', '.join(tool_names)} tool cannot run on this "
                f"host: a trial call ended with {done.status}: {why}. Fix the host (docs/multi_turn.md: 'What the "
                "python tool's sandbox promises') or leave these tools out."]
    missing = gaps(done.layers)
    if not missing or allow_weak:
        return []
    return [f"rollout.multi_turn.tools: the {', '.join(tool_names)} tool runs model-written code, and this host "
            f"cannot contain it: {'; '.join(missing)} missing (holds: {', '.join(done.layers) or 'nothing'}). Run "
            "on a host that allows them, or set rollout.multi_turn.allow_weak_sandbox=true to accept the risk."]
