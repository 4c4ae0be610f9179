"""Resume under torchrun (gloo, 2 ranks): exact resume at TP1xDP2, TP2, PP2 with the plain and the
distributed optimizer; weights and optimizer state loaded at another layout; a save killed mid-way.

Two launches (tests/cases/checkpoint_resume.py): `train` runs 2 steps, saves, runs 2 more; `resume` is a fresh process that
loads the step-2 checkpoint and must reproduce steps 3-4 bitwise, then dies in the middle of a save."""
import json
from pathlib import Path

import pytest

from rlhf_mcore.checkpoint import find_latest, list_checkpoints, load_checkpoint, save_checkpoint
from tests.launch import worker
from tests.support.checkpoint import build_state

pytestmark = pytest.mark.dist


def launch(phase: str, out: Path) -> tuple[int, str]:
    """(return code, stdout + stderr). Output goes to a file, not a pipe: a killed rank's leftover child
    process cannot keep the test waiting for the pipe to close."""
    proc = worker(2, ("checkpoint_resume", "--phase", phase, "--out", out), check=False, log=out / f"{phase}.log")
    return proc.returncode, proc.stdout


def result_of(rc: int, output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line (rc={rc}):\n{output[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume")
    rc, output = launch("train", out)
    assert rc == 0, output[-6000:]
    train = result_of(rc, output)
    rc, output = launch("resume", out)
    return out, train, result_of(rc, output), (rc, output)


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
    out, _, _, (rc, output) = runs
    assert rc != 0 and "KILLED rank 0" in output and "KILLED rank 1" in output
    run_dir = out / "dp2"
    assert find_latest(run_dir) == str(run_dir / "global_step_2")
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]
    orphans = [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]
    assert len(orphans) == 1 and orphans[0].startswith("global_step_3.tmp-"), orphans


def test_one_rank_loads_the_two_rank_checkpoint_and_cleans_the_orphan(runs, mcore_ctx):
    out, straight, _, _ = runs
    run_dir = out / "dp2"
    state = build_state(mcore_ctx)
    assert load_checkpoint(find_latest(run_dir), {"actor": state}, mcore_ctx)["step"] == 2  # dp2 -> dp1
    assert not [p for p in run_dir.iterdir() if ".tmp-" in p.name]  # the load removed the orphan
    save_checkpoint(run_dir, 3, {"actor": state}, {"step": 3}, mcore_ctx, keep=1)
    assert [s for s, _ in list_checkpoints(run_dir)] == [3] and find_latest(run_dir).endswith("global_step_3")
