"""Resume under torchrun (gloo, 2 ranks): exact resume at TP1xDP2, TP2, PP2 with the plain and the
distributed optimizer; weights and optimizer state loaded at another layout; a save killed mid-way.

Two launches (ckpt_worker.py): `train` runs 2 steps, saves, runs 2 more; `resume` is a fresh process that
loads the step-2 checkpoint and must reproduce steps 3-4 bitwise, then dies in the middle of a save."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_mcore.checkpoint import find_latest, list_checkpoints

pytestmark = pytest.mark.dist
WORKER = Path(__file__).with_name("ckpt_worker.py")
ROOT = WORKER.parents[2]


def launch(phase: str, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
           str(29300 + os.getpid() % 500), str(WORKER), "--phase", phase, "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume")
    train = launch("train", out)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-5000:]
    resume = launch("resume", out)
    return out, result_of(train), result_of(resume), resume


def test_exact_resume_every_layout_and_optimizer(runs):
    _, straight, resumed, _ = runs
    for case, r in resumed["resume"].items():
        assert r["extra"] == {"step": 2, "losses": straight[case][:2]}, case
        assert r["losses"] == r["ref_losses"] == straight[case][2:], case  # float equality: bitwise
        assert r["params_equal"], f"{case}: parameters after steps 3-4 differ from the uninterrupted run"
        assert r["rng_equal"], f"{case}: RNG draws after the load differ from those after the save"
        assert r["adam_steps"] == [2.0], case


def test_other_layout_same_weights_and_training_continues(runs):
    _, _, resumed, _ = runs
    for name, r in resumed["cross"].items():
        assert r["weights_logp_diff"] <= 1e-6, name
        for got, want in zip(r["losses"], r["ref_losses"]):
            assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (name, r["losses"], r["ref_losses"])
        assert r["adam_steps"] == [4.0], name  # restored at 2, then two updates


def test_killed_save_leaves_previous_checkpoint(runs):
    out, _, _, resume = runs
    assert resume.returncode != 0 and "KILLED rank 0" in resume.stdout
    run_dir = out / "dp2"
    assert find_latest(run_dir) == str(run_dir / "global_step_2")
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]
    orphans = [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]
    assert len(orphans) == 1 and orphans[0].startswith("global_step_3.tmp-"), orphans
