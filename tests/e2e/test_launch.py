"""launch/torchrun.sh and launch/slurm.sbatch find the repository's venv and restart dead ranks with
trainer.resume=auto (DRY_RUN prints the command; the restart itself: tests/e2e/reliability/test_auto_restart.py)."""
import os
import shutil
import subprocess

import pytest

from tests.support.paths import ROOT_STR as ROOT


def fake_repo(tmp_path):
    """A copy of launch/ beside a .venv/bin/python that exists."""
    shutil.copytree(os.path.join(ROOT, "launch"), tmp_path / "launch")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return str(python)


def dry_run(script, env, cwd):
    proc = subprocess.run(["bash", script, "configs/tiny_grpo.yaml", "a.b=1"], capture_output=True, text=True,
                          env={**os.environ, "DRY_RUN": "1", **env}, cwd=cwd, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_torchrun_script_uses_the_repo_venv(tmp_path):
    python = fake_repo(tmp_path)
    out, err = dry_run(str(tmp_path / "launch" / "torchrun.sh"), {"NPROC": "2"}, cwd="/")
    assert out.startswith(f"{python} -m rlhf_mcore.launcher --standalone --nproc_per_node 2") and err == ""
    assert out.rstrip().endswith("-m rlhf_mcore.train --config configs/tiny_grpo.yaml trainer.resume=auto a.b=1")


def test_launch_scripts_restart_dead_ranks_with_resume_auto(tmp_path):
    """torchrun restarts the ranks MAX_RESTARTS (3) times; each attempt resumes (user overrides come after)."""
    fake_repo(tmp_path)
    script = str(tmp_path / "launch" / "torchrun.sh")
    assert " --max-restarts 3 " in dry_run(script, {"NPROC": "2"}, cwd="/")[0]
    assert " --max-restarts 0 " in dry_run(script, {"NPROC": "2", "MAX_RESTARTS": "0"}, cwd="/")[0]
    out, _ = dry_run(str(tmp_path / "launch" / "slurm.sbatch"), {"SLURM_SUBMIT_DIR": str(tmp_path),
                                                                "MAX_RESTARTS": "5"}, cwd=str(tmp_path))
    assert " --max-restarts 5 " in out and out.rstrip().endswith("trainer.resume=auto a.b=1")
    assert "#SBATCH --signal=TERM@300" in (tmp_path / "launch" / "slurm.sbatch").read_text()


def test_slurm_script_uses_the_venv_of_the_submit_dir(tmp_path):
    python = fake_repo(tmp_path)
    elsewhere = tmp_path / "spool"  # sbatch runs a copy of the script from its spool directory
    elsewhere.mkdir()
    shutil.copy(tmp_path / "launch" / "slurm.sbatch", elsewhere / "slurm_script")
    out, err = dry_run(str(elsewhere / "slurm_script"), {"SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_NNODES": "2",
                                                          "SLURM_JOB_NODELIST": "node1"}, cwd=str(tmp_path))
    assert out.startswith(f"srun --nodes 2 --ntasks-per-node 1 {python} -m rlhf_mcore.launcher") and err == ""
    _, err = dry_run(str(elsewhere / "slurm_script"), {"SLURM_SUBMIT_DIR": str(elsewhere)}, cwd=str(tmp_path))
    assert "not found (run `make venv`" in err


FAIL_ON_RANK = """import os, sys, time, types
if os.environ.get("FAIL_RANK"):  # rlhf_mcore.train's call of train(cfg): raises on FAIL_RANK, the others wait
    def train(cfg):
        if os.environ["RANK"] == os.environ["FAIL_RANK"]:
            raise RuntimeError("injected failure on rank " + os.environ["RANK"])
        time.sleep(300)

    sys.modules["rlhf_mcore.trainer.loop"] = types.SimpleNamespace(train=train)  # the trainer is not imported
"""


@pytest.mark.dist
def test_a_failing_rank_other_than_0_is_named_with_its_traceback(tmp_path):
    """The console shows rank 0 only, yet rank 1's traceback and exit code reach the launcher's output (torchrun's
    summary of the error file rlhf_mcore.train records), and its stderr stays in LOG_DIR."""
    (tmp_path / "sitecustomize.py").write_text(FAIL_ON_RANK)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAIL_RANK": "1", "NPROC": "2", "MAX_RESTARTS": "0",
           "LOG_DIR": str(tmp_path / "logs")}
    proc = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), "configs/tiny_grpo.yaml",
                           f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    root_cause = out.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root_cause and "exitcode  : 1" in root_cause
    assert "RuntimeError: injected failure on rank 1" in root_cause and 'File "' in root_cause, out[-3000:]
    (stderr_log,) = (tmp_path / "logs").glob("*/attempt_0/1/stderr.log")
    assert "injected failure on rank 1" in stderr_log.read_text()


def test_the_scripts_take_overrides_alone_and_size_from_the_allocation(tmp_path):
    fake_repo(tmp_path)
    proc = subprocess.run(["bash", str(tmp_path / "launch" / "torchrun.sh"), "trainer.total_steps=2"],
                          capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", "NPROC": "1"}, timeout=60)
    assert proc.returncode == 0 and "--config" not in proc.stdout, proc.stderr
    assert proc.stdout.rstrip().endswith("-m rlhf_mcore.train trainer.resume=auto trainer.total_steps=2")
    for slurm_env, ranks in (({"SLURM_GPUS_ON_NODE": "4"}, 4), ({"SLURM_GPUS_PER_NODE": "h100:2"}, 2), ({}, 8)):
        out, _ = dry_run(str(tmp_path / "launch" / "slurm.sbatch"), {"SLURM_SUBMIT_DIR": str(tmp_path), **slurm_env},
                         cwd=str(tmp_path))
        assert f" --nproc_per_node {ranks} " in out, (slurm_env, out)


@pytest.mark.parametrize("script", ["torchrun.sh", "slurm.sbatch"])
def test_bad_input_stops_once_with_exit_2_before_any_rank_starts(tmp_path, script):
    env = {**os.environ, "NPROC": "1", "GPUS_PER_NODE": "1", "SLURM_SUBMIT_DIR": ROOT, "LOG_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "configs/tiny_grpo.yaml",
                           "rollout.n=0", f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and out.count("invalid config:") == 1 and "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "run").exists() and "torch.distributed" not in out


def test_the_launcher_never_restarts_ranks_that_cannot_start(tmp_path):
    """A start-up problem the ranks find themselves (here a config error, past the scripts' own check): exit 2 once,
    no restart although --max-restarts 3, and the launcher's exit code is the ranks' 2, not a traceback and 1."""
    proc = subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "rlhf_mcore.launcher", "--standalone",
                           "--nproc_per_node", "1", "--max-restarts", "3", "-m", "rlhf_mcore.train", "--config",
                           "configs/tiny_grpo.yaml", "rollout.n=0", f"trainer.output_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert out.count("invalid config:") == 1 and "not restarting them" in out and "Traceback" not in out, out[-3000:]
