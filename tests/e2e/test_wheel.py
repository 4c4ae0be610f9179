"""The wheel built from this tree holds everything the package imports: built, installed (non-editable) into a fresh
venv that sees the test venv's dependencies, then imported and run from outside the source tree."""
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.paths import ROOT

SOURCES = ("setup.py", "pyproject.toml", "rlhf_mcore", "kernels")


def _run(cmd, cwd, timeout=240):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _expected_files() -> set[str]:
    """Every module of the source tree, as the wheel names it (kernels/ lands in rlhf_mcore/kernels/)."""
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rlhf_mcore").rglob("*.py")}
    return files | {f"rlhf_mcore/kernels/{p.name}" for p in (ROOT / "kernels").glob("*.py")}


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    src = tmp_path / "src"  # a copy, so the build writes no build/ or egg-info into the checkout
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
          src], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("rlhf_mcore-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    assert _expected_files() <= shipped, f"missing from the wheel: {sorted(_expected_files() - shipped)}"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    (purelib / "test_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # torch, megatron, pip, ...
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", "--no-warn-conflicts", wheel],
         cwd=tmp_path)

    where = _run([py, "-c", "import rlhf_mcore, rlhf_mcore.kernels.logits, rlhf_mcore.kernels.fused_logprob, "
                  "rlhf_mcore.kernels.decode_attention, rlhf_mcore.trainer.loop as t; "
                  "print(rlhf_mcore.__file__, rlhf_mcore.kernels.logits.__file__, t.__file__)"], cwd=tmp_path)
    assert all(path.startswith(str(venv)) for path in where.split()), where
    tiny = [f"data.train_files={ROOT}/data/tiny/train.parquet", f"data.val_files={ROOT}/data/tiny/test.parquet",
            f"reward.custom_fn={ROOT}/data/tiny/reward.py:vowel_fraction"]
    out = _run([py, "-m", "rlhf_mcore.train", "--config", ROOT / "configs" / "tiny_grpo.yaml", "--validate-only",
                *tiny], cwd=tmp_path)
    assert "adv_estimator: grpo" in out
