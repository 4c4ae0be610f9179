"""RoPE types (models/rope.py) against transformers' own definitions (`ROPE_INIT_FUNCTIONS`), at the real shapes:
Llama 3.1 (llama3, factor 8), Llama 3.2 (llama3, factor 32), linear and dynamic scaling. The frequencies start
from megatron's plain ones, as the build gives them to its RotaryEmbedding. Logits of tiny Llama-3.1/3.2 and
linear-scaled Qwen2 models against transformers are in tests/unit/models/test_weights.py (TP1) and
tests/dist/models/test_hf_layouts.py (TP2, PP2)."""
import pytest
import torch

from rlhf_mcore.models.rope import rope_errors, scaled_inv_freq

LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CASES = {
    "llama3.1": {"rope_type": "llama3", "factor": 8.0, **LLAMA3},
    "llama3.2": {"rope_type": "llama3", "factor": 32.0, **LLAMA3},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


def plain(theta: float, dim: int) -> torch.Tensor:
    """megatron's RotaryEmbedding.inv_freq."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


@pytest.mark.parametrize("name", sorted(CASES))
def test_frequencies_equal_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tests.support.tiny_hf import tiny_config

    params = {**CASES[name], "rope_theta": 500000.0}
    config = tiny_config("llama", False, hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                         rope_scaling=dict(params))  # Llama-3.2-1B's head_dim 64
    theirs, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    ours = scaled_inv_freq({"rope_scaling": params}, plain(500000.0, 64))
    assert attention_factor == 1.0  # these types leave the attention unscaled
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    if name != "dynamic":
        assert not torch.equal(ours, plain(500000.0, 64))  # the scaling changed something


def test_types_that_scale_the_attention_are_refused_and_missing_parameters_named():
    assert rope_errors({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "c")[0].startswith(
        "c: rope scaling type 'yarn' is not supported (field rope_parameters). Supported: default, dynamic, "
        "linear, llama3")
    missing = rope_errors({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "c")
    assert [m.split(" is missing")[0] for m in missing] == [
        "c: rope_scaling.low_freq_factor", "c: rope_scaling.high_freq_factor",
        "c: rope_scaling.original_max_position_embeddings"]
    assert rope_errors({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "c") == []
