"""A full disk anywhere (metrics JSONL, TensorBoard, the HF export) stops the run with exit 6 and one line, no
traceback, and leaves no process behind. The fault: every write to the target fails with ENOSPC."""
import contextlib
import os
import subprocess

import pytest

from tests.support.ports import free_port
from tests.support.reliability import ROOT, env, train_cmd, wait_for

SITE = ROOT / "tests" / "e2e" / "reliability" / "enospc_site"
CASES = {  # name: (RLHF_ENOSPC, extra overrides)
    "metrics_jsonl": ("metrics.jsonl", []),
    "tensorboard": ("tfevents", ["trainer.logger=[console,jsonl,tensorboard]"]),
    "hf_export": ("safetensors", ["trainer.export_hf=true"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_enospc_exits_6_with_one_line(name, tmp_path):
    target, extra = CASES[name]
    environ = {**env(0, 1, free_port()), "RLHF_ENOSPC": target, "PYTHONPATH": f"{SITE}:{ROOT}"}
    cmd = train_cmd(f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=1", "trainer.export_hf=false",
                    "data.val_files=", *extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=environ,
                            start_new_session=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 6, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if "run stopped:" in x]
    assert "no space left on device (ENOSPC)" in line, line
    in_session = lambda: subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()  # noqa: E731
    assert wait_for(lambda: not in_session(), timeout_s=10), f"processes left in the run's session: {in_session()}"


@contextlib.contextmanager
def small_disk(tmp_path, size: str):
    """A tmpfs of `size` at tmp_path/fs (root only): a real full disk, no fault injection."""
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(fs)], check=True)
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_really_full_disk_during_the_hf_export_exits_6(tmp_path):
    """A filesystem with room for the checkpoint (2.5 MB) but not the export (0.7 MB more)."""
    with small_disk(tmp_path, "2800k") as fs:
        cmd = train_cmd(f"trainer.output_dir={fs / 'run'}", "trainer.total_steps=1", "trainer.export_hf=true",
                        "data.val_files=")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(0, 1, free_port()), timeout=300)
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if "run stopped:" in x]
    assert "no space left on device (ENOSPC)" in line and "HF export" in line, line


def start_problem(tmp_path, output_dir, *extra) -> str:
    cmd = train_cmd(f"trainer.output_dir={output_dir}", "trainer.total_steps=1", "trainer.export_hf=false",
                    "data.val_files=", *extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(0, 1, free_port()), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("  - ")]
    return line


def test_an_unwritable_metrics_file_is_one_line_at_start(tmp_path):
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)  # unwritable for root too
    line = start_problem(tmp_path, tmp_path / "run")
    assert f"trainer.logger=jsonl: cannot write {tmp_path / 'run' / 'metrics.jsonl'} (Is a directory)" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_disk_at_start_names_the_directory(tmp_path):
    with small_disk(tmp_path, "8k") as fs:
        subprocess.run(["dd", "if=/dev/zero", f"of={fs / 'fill'}", "bs=1k", "count=8"], capture_output=True)  # full
        line = start_problem(tmp_path, fs / "run")
    assert f"trainer.output_dir={fs / 'run'}: no space left on device (ENOSPC)" in line, line
