"""Model registry, spec choice, heads, and SDPA attention against megatron's stock attention."""
import dataclasses

import pytest
import torch

from rlhf_mcore.models.attention import bottom_right_causal_mask
from rlhf_mcore.models.build import build_model, choose_layer_spec
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.layer_specs import have_transformer_engine
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.transformer_config import load_hf_config, padded_vocab_size, to_transformer_config
from tests.support.tiny import tiny_model_config


def test_registry_finds_families_by_architecture_or_model_type():
    assert spec_for_hf_config({"architectures": ["Qwen2ForCausalLM"]}).qkv_bias is True
    assert spec_for_hf_config({"model_type": "mistral"}).name == "mistral"
    assert spec_for_hf_config({"architectures": ["LlamaForSequenceClassification"]}).name == "llama"
    with pytest.raises(ValueError, match=r"config.json: unsupported architecture \(architectures=\['GPT2"):
        spec_for_hf_config({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})


def test_unsupported_hf_fields_are_named():
    cfg = tiny_model_config()
    hf = load_hf_config(cfg.model)
    for field, value, message in (("hidden_act", "xielu", "hidden_act 'xielu' is not supported"),
                                  ("mlp_bias", True, "'mlp_bias'=true with 'attention_bias'=false is not supported"),
                                  ("rope_parameters", {"rope_type": "longrope"}, "rope scaling type 'longrope'")):
        with pytest.raises(ValueError, match=message):
            to_transformer_config({**hf, field: value}, cfg.model, cfg.parallel, source="x/config.json")


def test_hf_fields_map_to_transformer_config():
    cfg = tiny_model_config()
    hf = {**load_hf_config(cfg.model), "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
          "rms_norm_eps": 1e-5, "architectures": ["Qwen2ForCausalLM"], "head_dim": 16}
    tc = to_transformer_config(hf, cfg.model, cfg.parallel)
    shape = (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size, tc.num_query_groups, tc.kv_channels)
    assert shape == (2, 64, 128, 2, 16)
    assert tc.add_qkv_bias and tc.gated_linear_unit and tc.normalization == "RMSNorm" and tc.layernorm_epsilon == 1e-5
    assert padded_vocab_size(250, 128) == 256


def test_llama_biases_and_activation_map_to_transformer_config():
    import torch.nn.functional as F

    cfg = tiny_model_config()
    hf = load_hf_config(cfg.model)
    plain = to_transformer_config(hf, cfg.model, cfg.parallel)
    assert not plain.add_bias_linear and plain.activation_func is F.silu
    tc = to_transformer_config({**hf, "attention_bias": True, "mlp_bias": True, "hidden_act": "gelu"}, cfg.model,
                               cfg.parallel)
    assert tc.add_bias_linear and tc.gated_linear_unit and tc.activation_func is F.gelu  # GeGLU, exact erf
    assert not tc.bias_activation_fusion  # megatron's fused GeGLU is the tanh approximation


def test_spec_choice_logs_and_falls_back():
    _, backend = choose_layer_spec("auto")
    assert backend == ("te" if have_transformer_engine() else "sdpa")
    if not have_transformer_engine():
        with pytest.raises(ValueError, match="model.attention_backend: 'te' needs transformer_engine"):
            choose_layer_spec("te")


def test_bottom_right_mask_matches_decode_positions():
    assert bottom_right_causal_mask(2, 4, "cpu").tolist() == [[True, True, True, False], [True, True, True, True]]


def _forward(cfg, ctx, role, tokens):
    model = build_model(role, load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)
    tokens = tokens.to(ctx.device)
    pos = torch.arange(tokens.size(1), device=ctx.device).unsqueeze(0).expand_as(tokens)
    return model, model(tokens, pos, None)


def test_sdpa_attention_equals_stock_local_attention(mcore_ctx):
    tokens = torch.randint(0, 250, (3, 17), generator=torch.Generator().manual_seed(0))
    cfg = tiny_model_config(attention_backend="sdpa")
    _, sdpa = _forward(cfg, mcore_ctx, "actor", tokens)
    local_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_backend="local"))
    _, local = _forward(local_cfg, mcore_ctx, "actor", tokens)
    assert sdpa.shape == (3, 17, 64)
    torch.testing.assert_close(sdpa, local, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_sdpa_kernel_reaches_every_layer_and_keeps_the_outputs(mcore_ctx, kernel):
    """model.sdpa_kernel puts its kernel first in every layer's SDPAttention; on CUDA (bf16) the outputs stay
    within bf16 rounding of torch's own choice, on CPU (no kernel choice) they are identical."""
    from torch.nn.attention import SDPBackend

    tokens = torch.randint(0, 250, (3, 17), generator=torch.Generator().manual_seed(0))
    dtype = "bf16" if torch.cuda.is_available() else "fp32"
    cfg = tiny_model_config(attention_backend="sdpa", dtype=dtype)
    _, auto = _forward(cfg, mcore_ctx, "actor", tokens)
    model, chosen = _forward(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, sdpa_kernel=kernel)),
                             mcore_ctx, "actor", tokens)
    first = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[kernel]
    assert all(layer.self_attention.core_attention.kernels[0] == first for layer in model.decoder.layers)
    tol = 2e-2 if dtype == "bf16" else 0.0
    torch.testing.assert_close(chosen.float(), auto.float(), atol=tol, rtol=tol)


def test_heads_and_identical_init(mcore_ctx):
    tokens = torch.randint(0, 250, (2, 9), generator=torch.Generator().manual_seed(1))
    cfg = tiny_model_config()
    actor, hidden = _forward(cfg, mcore_ctx, "actor", tokens)
    actor2, hidden2 = _forward(cfg, mcore_ctx, "actor", tokens)
    assert torch.equal(hidden, hidden2), "two builds of the same model must be identical"
    assert lm_output_weight(actor).shape == (256, 64)
    critic, values = _forward(cfg, mcore_ctx, "critic", tokens)
    assert values.shape == (2, 9, 1)
    ref, _ = _forward(cfg, mcore_ctx, "ref", tokens)
    assert not any(p.requires_grad for p in ref.parameters())
    tied = tiny_model_config(tie_embeddings=True)
    tied_actor, _ = _forward(tied, mcore_ctx, "actor", tokens)
    assert lm_output_weight(tied_actor) is tied_actor.embedding.word_embeddings.weight
    with pytest.raises(ValueError, match="unknown model role 'policy'"):
        build_model("policy", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)


def test_building_keeps_the_callers_rng_state(mcore_ctx):
    """Initialisation reseeds (fixed seeds per embedding / layer / head) only inside a forked RNG."""
    cfg = tiny_model_config()
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    first = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(7)  # another caller state: the same weights
    second = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values())
               if torch.is_tensor(a))
