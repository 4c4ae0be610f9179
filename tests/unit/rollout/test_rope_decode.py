"""The native decoder on a YaRN-scaled model (tests/support/tiny_hf.py's qwen2_yarn RoPE): its cos / sin tables
carry the attention factor megatron's attention applies (bitwise), and both decode paths, megatron's eager
inference and the static decoder's functional layer, give the trainer's log-probs."""
import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.rope import attention_scaling
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout import decode_layer as fn
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.static_decode import StaticDecoder, rotate
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config
from tests.support.tiny_hf import YARN
from tests.unit.rollout.test_static_decode import rollout_gap


@pytest.fixture(scope="module")
def yarn_actor(mcore_ctx):
    """A tiny fp32 Qwen2-shaped actor with YaRN RoPE (factor 4, attention factor 1.139), every parameter random."""
    cfg = tiny_model_config(family="qwen2", num_layers=2)
    hf = {**load_hf_config(cfg.model), "rope_scaling": YARN, "max_position_embeddings": 1024}
    model = unwrap_model(build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def test_rope_tables_carry_megatrons_attention_factor_bitwise(yarn_actor):
    scale = attention_scaling(yarn_actor.config)
    assert scale == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    attention = yarn_actor.decoder.layers[0].self_attention
    freqs = yarn_actor.rotary_pos_emb(32)[torch.tensor([0, 7, 31])]  # [3, 1, 1, D]
    t = torch.randn(3, 5, 4, freqs.size(-1))
    cos, sin = fn.rope_tables(freqs, t.dtype, scale)
    assert torch.equal(fn.apply_rope(t, cos, sin), rotate(t, freqs, attention))
    unscaled = fn.apply_rope(t, *fn.rope_tables(freqs, t.dtype))
    assert not torch.allclose(unscaled, rotate(t, freqs, attention))  # the factor matters


@pytest.mark.parametrize("static", [False, True])
def test_decoders_give_the_trainers_logprobs(yarn_actor, mcore_ctx, static):
    engine = NativeRolloutEngine(yarn_actor, mcore_ctx, pad_id=0)
    if static:  # the static decode step (what CUDA graphs capture), eager on CPU
        from rlhf_mcore.models.heads import lm_output_weight

        engine.static = StaticDecoder(yarn_actor, lambda: lm_output_weight(yarn_actor), use_graphs=False)
    batch = engine.generate([[3, 4, 5, 6, 7], [9, 8]], SamplingParams(n=2, max_new_tokens=20, temperature=1.0, seed=1))
    gap = rollout_gap(yarn_actor, batch, mcore_ctx.pgs.tp)
    assert gap.numel() > 40 and gap.max() < 1e-4, gap.max()
