"""Qwen3 dense (models/families/qwen3.py): q/k RMSNorm per head, no QKV bias, head_dim 24 != hidden / heads 16.
A random tiny HF `Qwen3ForCausalLM` against our megatron model (fp32 logits within 1e-4 at TP1; TP2 and PP2 in
tests/dist/models/test_hf_layouts.py),
the converter's round trip bitwise, and the native decode paths (static functional layer and eager) against
the trainer's forward."""
import pytest
import torch

from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf
from tests.support.tiny_hf import max_logit_error, save_tiny, tiny_model


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("qwen3") / "hf", "qwen3")


@pytest.fixture(scope="module")
def ours(qwen3_dir, mcore_ctx):
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config

    hf_cfg = read_hf_config(qwen3_dir)
    model = build_for_conversion(hf_cfg, "actor", mcore_ctx, "fp32")
    load_hf_weights(model, str(qwen3_dir), hf_cfg, 0, 1)
    return model.eval()


def test_spec_maps_qk_norm_and_head_dim(ours):
    attention = ours.decoder.layers[0].self_attention
    assert ours.config.qk_layernorm and not ours.config.add_qkv_bias and ours.config.kv_channels == 24
    assert attention.q_layernorm.weight.shape == (24,) and attention.linear_qkv.bias is None


def test_logits_match_transformers_at_tp1(qwen3_dir, ours, mcore_ctx):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(qwen3_dir), dtype=torch.float32).eval()
    err = max_logit_error(hf, ours, mcore_ctx.pgs.tp)
    print(f"qwen3 tp1 logits max |ours - transformers| = {err:.2e}")
    assert err <= 1e-4


def test_converter_round_trip_is_bitwise():
    hf = tiny_model("qwen3", False)
    sd = {k: v for k, v in hf.state_dict().items()}
    config = hf.config.to_dict()
    back = mcore_to_hf(hf_to_mcore(sd, config), config)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    assert "model.layers.0.self_attn.q_norm.weight" in back


def test_functional_decode_layer_equals_megatron_bitwise(ours):
    from rlhf_mcore.rollout import decode_layer as fn
    from rlhf_mcore.rollout.static_decode import rotate

    assert fn.functional_blockers(ours) == []
    layer = ours.decoder.layers[1]
    attention = layer.self_attention
    hidden = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(2))
    freqs = ours.rotary_pos_emb(16)[torch.tensor([5, 6, 7])]
    cos, sin = fn.rope_tables(freqs, hidden.dtype)
    with torch.no_grad():
        q, k, v = attention.get_query_key_value_tensors(layer.input_layernorm(hidden), None)  # q/k normed
        want = rotate(q, freqs, attention), rotate(k, freqs, attention), v
        got = fn.attention_in(hidden, fn.layer_weights(layer), cos, sin, attention.num_query_groups_per_partition,
                              attention.hidden_size_per_attention_head, layer.input_layernorm.eps)
    assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("path", ["static", "eager"])
def test_native_decode_equals_the_trainers_forward(ours, mcore_ctx, path):
    from rlhf_mcore.models.heads import lm_output_weight
    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.rollout.native import NativeRolloutEngine
    from rlhf_mcore.rollout.static_decode import StaticDecoder
    from rlhf_mcore.rollout.types import SamplingParams

    engine = NativeRolloutEngine(ours, mcore_ctx, pad_id=0)
    if path == "static":  # the functional decoder the GPU runs graphed, here its eager steps
        engine.static = StaticDecoder(engine.model, lambda: lm_output_weight(ours), use_graphs=False)
    else:
        assert engine.static is None
    batch = engine.generate([[3, 4, 5, 6], [7, 8]], SamplingParams(n=2, max_new_tokens=6, temperature=0.0))
    with torch.no_grad():
        pos = torch.arange(batch.tokens.size(1))[None].expand_as(batch.tokens)
        logp, _ = token_logprobs(ours, ours(batch.tokens, pos, None), batch.tokens, mcore_ctx.pgs.tp)
    cols = torch.arange(batch.tokens.size(1))[None]
    start = batch.prompt_lengths[:, None]
    mask = (cols >= start) & (cols < start + batch.response_lengths[:, None])
    gap = (logp - batch.rollout_logprobs).abs()[mask].max().item()
    print(f"qwen3 {path} decode: max |rollout - trainer| log-prob = {gap:.2e}")
    assert mask.sum() == 4 * 6 and gap <= 1e-5
