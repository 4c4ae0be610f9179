"""HF <-> megatron weight tables (rlhf_mcore/models/weights.py): layouts, round trips, heads, and every error.

The megatron side is checked against a real GPTModel at TP1/PP1 (single-process gloo): the converted
state dict loads into it, its logits equal transformers' and its state dict converts back bitwise.
"""

import pytest
import torch

from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf, model_dims
from tests.support.tiny_hf import CASES, VOCAB, case_model, diff_state_dicts, tiny_model


def hf_dict(model) -> dict:
    cfg = model.config.to_dict()
    cfg["architectures"] = [type(model).__name__]
    return cfg


def hf_tensors(model) -> dict:
    """What save_pretrained writes: the state dict without the tied lm_head copy."""
    tied = model.config.tie_word_embeddings
    return {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def build(role, cfg, ctx, full_sd):
    from rlhf_mcore.convert.mcore import build_for_conversion, full_state_dict, load_full_state_dict

    model = build_for_conversion(cfg, role, ctx, "fp32")
    load_full_state_dict(model, full_sd, 0, 1)
    return model.eval(), full_state_dict(model)


def test_qkv_is_fused_per_query_group():
    model = tiny_model("qwen2", False)
    cfg, sd = hf_dict(model), hf_tensors(model)
    out = hf_to_mcore(sd, cfg)
    qkv = out["decoder.layers.1.self_attention.linear_qkv.weight"]
    bias = out["decoder.layers.1.self_attention.linear_qkv.bias"]
    q, k, v = (sd[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    hd = 16  # 64 hidden / 4 heads; 2 groups of 2 query heads
    expected = torch.cat([q[0:32], k[0:16], v[0:16], q[32:64], k[16:32], v[16:32]])
    assert torch.equal(qkv, expected)
    qb, kb, vb = (sd[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv")
    assert torch.equal(bias, torch.cat([qb[:2 * hd], kb[:hd], vb[:hd], qb[2 * hd:], kb[hd:], vb[hd:]]))
    gate, up = sd["model.layers.1.mlp.gate_proj.weight"], sd["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(out["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))


def test_vocab_rows_are_padded_with_zeros_and_dropped_on_export():
    model = tiny_model("mistral", False)
    cfg, sd = hf_dict(model), hf_tensors(model)
    out = hf_to_mcore(sd, cfg)
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert out[key].shape == (256, 64)
        assert torch.equal(out[key][VOCAB:], torch.zeros(256 - VOCAB, 64))
    assert hf_to_mcore(sd, cfg, divisible_by=64)["output_layer.weight"].shape == (256, 64)
    out["output_layer.weight"][VOCAB:] = 1.0  # padded rows never reach the HF side
    assert mcore_to_hf(out, cfg)["lm_head.weight"].shape == (VOCAB, 64)


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_through_a_megatron_model(case, mcore_ctx):
    tied = CASES[case][1]
    model = case_model(case)
    cfg, sd = hf_dict(model), hf_tensors(model)
    ours, state = build("actor", cfg, mcore_ctx, hf_to_mcore(sd, cfg, source=case))
    assert ("output_layer.weight" in state) != tied
    problems = diff_state_dicts(sd, mcore_to_hf(state, cfg))
    assert not problems, problems
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = ours(tokens, torch.arange(12).expand(2, 12), attention_mask=None)  # [b, s, h]
        logits = hidden @ lm_output_weight(ours).t()
        diff = (logits[..., :VOCAB] - model(tokens).logits).abs().max().item()
    assert diff < 1e-5, f"{case}: max logit diff {diff:.3e}"


def test_reward_score_head_round_trip_and_per_token_scores(mcore_ctx):
    model = tiny_model("llama", False, seq_cls=True)
    cfg, sd = hf_dict(model), hf_tensors(model)
    assert "score.weight" in sd and "lm_head.weight" not in sd
    full = hf_to_mcore(sd, cfg)  # role from LlamaForSequenceClassification: reward
    assert torch.equal(full["output_layer.weight"], sd["score.weight"])
    ours, state = build("reward", cfg, mcore_ctx, full)
    assert not diff_state_dicts(sd, mcore_to_hf(state, cfg))
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.score(model.model(tokens).last_hidden_state)  # [b, s, 1]
        got = ours(tokens, torch.arange(12).expand(2, 12), attention_mask=None)
    assert (expected - got).abs().max().item() < 1e-5


class ReadOnce(dict):
    """A state dict that records which tensors were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_only_converts_and_reads_the_requested_keys():
    model = tiny_model("qwen2", False)
    cfg, sd = hf_dict(model), ReadOnce(hf_tensors(model))
    wanted = {"decoder.layers.3.mlp.linear_fc1.weight", "output_layer.weight"}
    out = hf_to_mcore(sd, cfg, only=wanted)
    assert set(out) == wanted
    assert sd.read == {"model.layers.3.mlp.gate_proj.weight", "model.layers.3.mlp.up_proj.weight", "lm_head.weight"}


def test_tied_checkpoints_may_carry_an_identical_lm_head():
    model = tiny_model("qwen2", True)
    cfg, sd = hf_dict(model), dict(model.state_dict())  # lm_head.weight present and equal to the embedding
    assert "lm_head.weight" in sd and "output_layer.weight" not in hf_to_mcore(sd, cfg)


def test_critic_from_a_causal_lm_keeps_its_value_head_and_drops_lm_head():
    model = tiny_model("qwen2", False)
    cfg, sd = hf_dict(model), hf_tensors(model)
    out = hf_to_mcore(sd, cfg, role="critic")
    assert "output_layer.weight" not in out and "embedding.word_embeddings.weight" in out
    out["output_layer.weight"] = torch.ones(1, 64)
    back = mcore_to_hf(out, cfg, role="critic")
    assert torch.equal(back["score.weight"], torch.ones(1, 64)) and "lm_head.weight" not in back
    rm = tiny_model("qwen2", False, seq_cls=True)  # a critic initialised from a reward model takes its score
    rm_sd = hf_tensors(rm)
    assert torch.equal(hf_to_mcore(rm_sd, hf_dict(rm), role="critic")["output_layer.weight"], rm_sd["score.weight"])


def _mutated(mutate):
    model = tiny_model("llama", False)
    cfg, sd = hf_dict(model), dict(hf_tensors(model))
    mutate(cfg, sd)
    return cfg, sd


HF_ERRORS = {
    "missing tensor": (lambda c, s: s.pop("model.layers.2.mlp.up_proj.weight"),
                       r"src.safetensors: missing tensor 'model.layers.2.mlp.up_proj.weight' \(for megatron "
                       r"'decoder.layers.2.mlp.linear_fc1.weight'\)"),
    "shape mismatch": (lambda c, s: s.update({"model.norm.weight": torch.ones(65)}),
                       r"tensor 'model.norm.weight' has shape \[65\], expected \[64\]"),
    "unexpected tensor": (lambda c, s: s.update({"model.layers.4.mlp.up_proj.weight": torch.ones(1)}),
                          r"unexpected HF tensor\(s\) model.layers.4.mlp.up_proj.weight"),
    "mlp bias alone": (lambda c, s: c.update(mlp_bias=True),
                       r"config field 'mlp_bias'=true with 'attention_bias'=false is not supported"),
    "activation": (lambda c, s: c.update(hidden_act="xielu"), r"hidden_act 'xielu' is not supported"),
    "llama attention bias alone": (lambda c, s: c.update(attention_bias=True),
                                   r"config field 'attention_bias'=true with 'mlp_bias'=false is not supported"),
    "biases missing": (lambda c, s: c.update(attention_bias=True, mlp_bias=True),
                       r"missing tensor 'model.layers.0.self_attn.q_proj.bias' \(for megatron "
                       r"'decoder.layers.0.self_attention.linear_qkv.bias'\)"),
    "kv heads": (lambda c, s: c.update(num_key_value_heads=3),
                 r"config field 'num_key_value_heads'=3 does not divide num_attention_heads=4"),
    "missing field": (lambda c, s: c.pop("intermediate_size"), r"config field 'intermediate_size' is missing"),
    "architecture": (lambda c, s: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
                     r"src.safetensors: unsupported architecture \(architectures=\['GPT2LMHeadModel'\]"),
    "tied but different": (lambda c, s: c.update(tie_word_embeddings=True),
                           r"tie_word_embeddings is true but tensor 'lm_head.weight' differs"),
}


@pytest.mark.parametrize("name", sorted(HF_ERRORS))
def test_hf_to_mcore_errors_name_the_tensor_or_field_and_the_file(name):
    mutate, message = HF_ERRORS[name]
    cfg, sd = _mutated(mutate)
    with pytest.raises(ValueError, match=message):
        hf_to_mcore(sd, cfg, source="/ckpt/src.safetensors")


def test_head_and_role_errors():
    model = tiny_model("llama", False)
    cfg, sd = hf_dict(model), hf_tensors(model)
    with pytest.raises(ValueError, match=r"missing tensor 'score.weight' .* needs a \*ForSequenceClassification"):
        hf_to_mcore(sd, cfg, role="reward")
    with pytest.raises(ValueError, match=r"unknown model role 'policy'. Available: actor, ref, critic, reward"):
        hf_to_mcore(sd, cfg, role="policy")
    cls = tiny_model("llama", False, seq_cls=True)
    cls_sd = dict(hf_tensors(cls), **{"score.weight": torch.zeros(2, 64)})
    with pytest.raises(ValueError, match=r"'score.weight' has shape \[2, 64\], expected \[1, 64\].*num_labels"):
        hf_to_mcore(cls_sd, hf_dict(cls))


def test_mcore_to_hf_errors():
    model = tiny_model("qwen2", False)
    cfg = hf_dict(model)
    full = hf_to_mcore(hf_tensors(model), cfg)
    bad = dict(full)
    bad.pop("decoder.layers.3.self_attention.linear_qkv.bias")
    with pytest.raises(ValueError, match=r"ckpt: missing tensor 'decoder.layers.3.self_attention.linear_qkv.bias'"):
        mcore_to_hf(bad, cfg, source="ckpt")
    bad = dict(full, **{"decoder.layers.0.mlp.linear_fc1.weight": torch.zeros(96, 64)})
    with pytest.raises(ValueError, match=r"'decoder.layers.0.mlp.linear_fc1.weight' has shape \[96, 64\], "
                                         r"expected \[192, 64\]"):
        mcore_to_hf(bad, cfg, source="ckpt")
    bad = dict(full, **{"output_layer.weight": torch.zeros(200, 64)})
    with pytest.raises(ValueError, match=r"'output_layer.weight' has shape \[200, 64\], expected \[>=250, 64\]"):
        mcore_to_hf(bad, cfg, source="ckpt")
    with pytest.raises(ValueError, match=r"unexpected megatron tensor\(s\) decoder.layers.9.x"):
        mcore_to_hf(dict(full, **{"decoder.layers.9.x": torch.zeros(1)}), cfg, source="ckpt")


def test_model_dims_reads_head_dim_and_groups():
    dims = model_dims(dict(tiny_model("llama", True).config.to_dict(), head_dim=32), "cfg")
    assert (dims["q"], dims["kv"], dims["groups"]) == (128, 64, 2)
