"""Shared pytest set-up: GPU tests skip cleanly where CUDA is absent."""
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
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


def tiny_model_config(**overrides):
    """A tiny Llama-shaped Config (hidden 64, 2 layers, GQA 4/2, vocab 250)."""
    from rlhf_mcore.config import Config, ModelConfig

    fields = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  vocab_size=250)
    fields.update(overrides)
    return Config(model=ModelConfig(**fields))


def free_port() -> int:
    """A TCP port nobody listens on now (for torchrun's rendezvous in tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
