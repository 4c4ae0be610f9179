"""Shared pytest set-up: each test is marked with its tier (its folder under tests/); GPU tests skip cleanly
where CUDA is absent. Shared helpers live in tests/support/, launches go through tests/launch.py."""
import json
from pathlib import Path

import pytest
import torch

TIERS = ("unit", "dist", "e2e")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).resolve().relative_to(HERE).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mcore_ctx():
    """A one-rank gloo/NCCL group with megatron's TP=PP=1 state, shared by single-process tests."""
    import os

    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 2000))
    from rlhf_mcore.parallel import init_distributed

    return init_distributed(tp=1, pp=1, seed=1234)


@pytest.fixture(scope="session")
def tiny_work(tmp_path_factory, mcore_ctx):
    """work/hf/<case>/ for every case of tests/support/tiny_hf.py, and work/mcore/<case>_1x1/ converted in this
    process: built once per test run (per xdist worker)."""
    from tests.support.tiny_hf import CASES, save_tiny
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


# qwen2_rm: a *ForSequenceClassification reward model; llama_bias: every linear's bias read as TP slices
HF_LOAD_CASES = ("qwen2", "llama_tied", "qwen3", "qwen2_rm", "llama_bias")


@pytest.fixture(scope="session")
def hf_load_work(tmp_path_factory, mcore_ctx):
    """hf/<case>/ tiny HF checkpoints of HF_LOAD_CASES and mcore/<case>/ their TP1 conversions (in this process)."""
    from tests.support.tiny_hf import save_tiny
    from tools.convert_checkpoint import run

    work = tmp_path_factory.mktemp("hf_load")
    for case in HF_LOAD_CASES:
        hf_dir = save_tiny(work / "hf" / case, case.removesuffix("_rm"), seq_cls=case.endswith("_rm"))
        assert run(["hf-to-mcore", "--hf-dir", str(hf_dir), "--out", str(work / "mcore" / case)]) == 0
    return work


@pytest.fixture(scope="session")
def hf_load_moe_work(tmp_path_factory, mcore_ctx):
    """hf/<case>/ tiny HF Qwen3-MoE and Mixtral checkpoints, mcore/<case>/ their 1x1 conversions."""
    from tests.support.tiny_moe import tiny_mixtral, tiny_moe
    from tools.convert_checkpoint import run

    work = tmp_path_factory.mktemp("hf_load_moe")
    for case, model in (("qwen3_moe", tiny_moe(True)), ("mixtral", tiny_mixtral())):
        model.save_pretrained(str(work / "hf" / case))
        assert run(["hf-to-mcore", "--hf-dir", str(work / "hf" / case), "--out", str(work / "mcore" / case)]) == 0
    return work


@pytest.fixture
def verl_model_dir(tmp_path):
    """A tiny Qwen2 config.json, the model path of verl's command lines (tests/support/verl.py)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 4096}))
    return tmp_path
