"""Qwen3-MoE (models/families/qwen3_moe.py) on megatron-core's MoE layer (SequentialMLP experts, no TE): a random
tiny HF `Qwen3MoeForCausalLM` against ours (fp32 logits within 1e-4, EP1), with norm_topk_prob both ways, and
the converter's round trip bitwise."""
import pytest
import torch

from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf
from tests.tools.tiny_hf import randomize_

VOCAB = 250


def tiny_moe(norm_topk_prob: bool, seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, vocab_size=VOCAB,
                            max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    return model.eval()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_match_transformers_at_ep1(tmp_path, mcore_ctx, norm_topk_prob):
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.logprobs import full_logits

    hf = tiny_moe(norm_topk_prob)
    hf.save_pretrained(str(tmp_path))
    hf_cfg = read_hf_config(tmp_path)
    ours = build_for_conversion(hf_cfg, "actor", mcore_ctx, "fp32")
    load_hf_weights(ours, str(tmp_path), hf_cfg, 0, 1)
    ours.eval()
    assert ours.config.num_moe_experts == 8 and ours.config.moe_router_pre_softmax is (not norm_topk_prob)
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        want = hf(tokens).logits
        got = full_logits(ours, ours(tokens, pos, None), mcore_ctx.pgs.tp)
    err = (want - got).abs().max().item()
    print(f"qwen3_moe norm_topk_prob={norm_topk_prob} ep1 logits max |ours - transformers| = {err:.2e}")
    assert err <= 1e-4


def test_converter_round_trip_is_bitwise(tmp_path):
    from rlhf_mcore.models.hf_io import load_hf_state_dict, read_hf_config

    tiny_moe(True).save_pretrained(str(tmp_path))
    sd, config = load_hf_state_dict(tmp_path)[0], read_hf_config(tmp_path)
    mcore = hf_to_mcore(sd, config)
    assert mcore["decoder.layers.1.mlp.experts.local_experts.7.linear_fc1.weight"].shape == (64, 64)
    back = mcore_to_hf(mcore, config)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_unsupported_moe_layouts_are_named():
    from rlhf_mcore.models.families.qwen3_moe import check

    with pytest.raises(ValueError, match="mlp_only_layers"):
        check({"decoder_sparse_step": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 8}, "x")
