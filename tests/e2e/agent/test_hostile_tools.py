"""The python tool's sandbox under a table of attacks (tests/cases/hostile_tools.py: files and secrets, network
by every route, fork and clone by every route, signals and limits aimed at other processes, privileges, resource
bombs, output bombs, leftovers), run by a trainer process as root and as an unprivileged user. Every row must be
contained: no secret in any result, the victim process and the trainer untouched, nothing left behind, every
result within its limits."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rlhf_mcore.agent.containment import gaps
from tests.cases.hostile_tools import ROWS, SECRET, TOOL_ROWS
from tests.launch import env, worker_cmd
from tests.support.paths import ROOT
from tests.support.users import USER_ID, as_user, can_switch_user

WHO = ["root", "user"] if os.geteuid() == 0 else ["user"]


@pytest.fixture
def work():
    """A directory any user may enter (pytest's own tmp_path lies under a root-only 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="hostile-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_table(who: str, work: Path) -> list[dict]:
    dirs = {name: work / name for name in ("home", "tmp", "scratch")}
    for d in dirs.values():
        d.mkdir()
    cmd = worker_cmd("hostile_tools")
    if who == "user" and os.geteuid() == 0:
        if not can_switch_user():
            pytest.skip("needs setpriv and unshare to run as a user")
        for d in (dirs["home"], dirs["tmp"]):
            os.chown(d, USER_ID, USER_ID)
        cmd = as_user(cmd, str(dirs["scratch"]))
    environ = env({"HOME": str(dirs["home"]), "TMPDIR": str(dirs["tmp"]), "HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET})
    proc = subprocess.run(cmd, env=environ, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("who", WHO)
def test_every_attack_is_contained(who, work):
    lines = run_table(who, work)
    rows, summary = [line for line in lines if "row" in line], lines[-1]
    assert [r["row"] for r in rows] == [r[1] for r in ROWS + TOOL_ROWS]
    failed = [f"{r['category']}/{r['row']}: {'; '.join(r['problems'])} (result: {r['text'][-200:]!r})"
              for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert gaps(summary["layers"]) == [], summary
    assert (summary["uid"] == 0) == (who == "root")
    assert summary["peak_mb"] < 1024  # the trainer's memory, after the output and result bombs
