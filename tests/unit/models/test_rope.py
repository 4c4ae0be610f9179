"""RoPE types (models/rope.py) against transformers' own definitions (`ROPE_INIT_FUNCTIONS`), at the real shapes:
Llama 3.1 (llama3, factor 8), Llama 3.2 (llama3, factor 32), linear and dynamic scaling, and YaRN as Qwen2.5,
gpt-oss (no truncation) and DeepSeek (mscales) write it. The frequencies start from megatron's plain ones, as the
build gives them to its RotaryEmbedding; YaRN's attention factor is the one megatron's attention applies from the
TransformerConfig fields we set. Logits of tiny Llama-3.1/3.2, linear- and YaRN-scaled Qwen2 models against
transformers are in tests/unit/models/test_weights.py (TP1) and tests/dist/models/test_hf_layouts.py (TP2, PP2);
the native decoder's log-probs on the YaRN model in tests/unit/rollout/test_rope_decode.py."""
import doctest
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.models import rope
from rlhf_mcore.models.rope import attention_scaling, megatron_fields, rope_errors, scaled_inv_freq

LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CASES = {
    "llama3.1": {"rope_type": "llama3", "factor": 8.0, **LLAMA3},
    "llama3.2": {"rope_type": "llama3", "factor": 32.0, **LLAMA3},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "yarn_gpt_oss": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
    "yarn_mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn_mscale_one": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                        "mscale": 1.0},  # one mscale alone: the factor's own attention factor
    "yarn_stated_factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                           "attention_factor": 1.2079441541679836},  # 0.1 ln 8 + 1, written out
}


def test_doctests():
    assert doctest.testmod(rope).failed == 0


def plain(theta: float, dim: int) -> torch.Tensor:
    """megatron's RotaryEmbedding.inv_freq."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


@pytest.mark.parametrize("name", sorted(CASES))
def test_frequencies_and_attention_factor_equal_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tests.support.tiny_hf import tiny_config

    params = {**CASES[name], "rope_theta": 500000.0}
    config = tiny_config("llama", False, hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                         rope_scaling=dict(params))  # Llama-3.2-1B's head_dim 64
    theirs, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    hf = {"rope_scaling": params, "max_position_embeddings": 131072}
    ours = scaled_inv_freq(hf, plain(500000.0, 64))
    assert rope_errors(hf, "c") == []
    if params["rope_type"] == "yarn":
        assert torch.equal(ours, theirs.float())  # the same operations in the same order
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    if name != "dynamic":
        assert not torch.equal(ours, plain(500000.0, 64))  # the scaling changed something
    # what megatron's attention multiplies into cos / sin, from the fields the build sets on its config
    assert attention_scaling(SimpleNamespace(**megatron_fields(hf))) == attention_factor
    assert (attention_factor != 1.0) == (params["rope_type"] == "yarn")


def test_yarn_without_its_original_context_uses_max_position_embeddings_as_transformers_does():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tests.support.tiny_hf import tiny_config

    params = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    config = tiny_config("qwen2", False, max_position_embeddings=2048, rope_scaling=dict(params))
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert torch.equal(scaled_inv_freq({"rope_scaling": params, "max_position_embeddings": 2048}, plain(1e6, 16)),
                       theirs)


def test_unsupported_types_are_refused_and_missing_parameters_named():
    assert rope_errors({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, "c")[0].startswith(
        "c: rope scaling type 'longrope' is not supported (field rope_parameters). Supported: default, dynamic, "
        "linear, llama3, yarn")
    missing = rope_errors({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "c")
    assert [m.split(" is missing")[0] for m in missing] == [
        "c: rope_scaling.low_freq_factor", "c: rope_scaling.high_freq_factor",
        "c: rope_scaling.original_max_position_embeddings"]
    assert rope_errors({"rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 8}}, "c") == [
        "c: rope_parameters.factor is missing for rope type 'yarn'. Add it (HF's RoPE parameters)."]
    assert rope_errors({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.0}}, "c") == [
        "c: rope_scaling.attention_factor=1.0 is not supported: only the one factor/mscale give "
        "(1.13863) is (megatron's YaRN hook). Use a model without it."]
    assert rope_errors({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "c") == []


def test_interleaved_mrope_through_megatrons_contiguous_table_is_qwen3_vls():
    """Qwen3-VL's interleaved M-RoPE (transformers) equals megatron's MultimodalRotaryEmbedding fed
    `interleaved_mrope_section`, on positions whose t, h and w differ (image tokens; text cannot tell the layouts
    apart), and the contiguous section of the same sizes does not."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from rlhf_mcore.cpu_compat import apply_cpu_patches
    from rlhf_mcore.models.mrope import interleaved_mrope_section

    apply_cpu_patches()  # megatron puts its frequencies on torch.cuda.current_device() (a no-op on a GPU)
    section = [24, 20, 20]
    config = Qwen3VLTextConfig(head_dim=128, hidden_size=256, num_attention_heads=2, rope_parameters={
        "rope_type": "default", "rope_theta": 5e6, "mrope_section": section, "mrope_interleaved": True})
    cos, sin = Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), pos := torch.randint(
        0, 500, (3, 2, 9), generator=torch.Generator().manual_seed(0)))  # [B, S, head_dim]
    rope = MultimodalRotaryEmbedding(kv_channels=128, rotary_percent=1.0, rotary_base=5e6)
    emb = rope(pos, interleaved_mrope_section(section))[:, :, 0].transpose(0, 1)  # [B, S, head_dim]
    torch.testing.assert_close(emb.cos(), cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(emb.sin(), sin, atol=1e-6, rtol=0)
    contiguous = rope(pos, section)[:, :, 0].transpose(0, 1)
    assert (contiguous.cos() - cos).abs().max() > 0.1
