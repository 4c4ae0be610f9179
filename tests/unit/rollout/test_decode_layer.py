"""The functional decode layer against megatron's own modules (bitwise, on CPU), its compiled form traced
as one graph, and the one-pass sampler against the softmax / log_softmax it replaces."""
from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout import decode_layer as fn
from rlhf_mcore.rollout.native import unwrap_model
from rlhf_mcore.rollout.sampling import gumbel_argmax, mask_padded_vocab, sample_plain, token_logprobs
from rlhf_mcore.rollout.static_decode import DecodeFns, bias_add, head_plain, rotate
from tests.support.tiny import tiny_model_config


def test_doctests():
    assert doctest.testmod(fn).failed == 0


def random_models(ctx, family: str, **hf_fields) -> dict:
    """A tiny model of `family` (config.json fields changed by hf_fields) with every parameter random, in fp32
    and bf16."""
    models = {}
    for dtype in ("fp32", "bf16"):
        cfg = tiny_model_config(family=family, num_layers=2, dtype=dtype)
        hf = {**load_hf_config(cfg.model), **hf_fields}
        model = unwrap_model(build_model("actor", hf, cfg.model, cfg.parallel, ctx))
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        models[dtype] = model.eval()
    return models


@pytest.fixture(scope="module")
def qwen(mcore_ctx):
    """A tiny Qwen2-shaped model (QKV bias)."""
    return random_models(mcore_ctx, "qwen2")


@pytest.fixture(scope="module")
def llama_bias_gelu(mcore_ctx):
    """A tiny Llama with a bias on every linear (attention_bias + mlp_bias) and a GeGLU MLP (gelu_new)."""
    return random_models(mcore_ctx, "llama", attention_bias=True, mlp_bias=True, hidden_act="gelu_new")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rope_tables_equal_megatron_bitwise(qwen, dtype):
    model = qwen[dtype]
    attention = model.decoder.layers[0].self_attention
    freqs = model.rotary_pos_emb(32)[torch.tensor([0, 7, 31])]  # [3, 1, 1, D]
    t = torch.randn(3, 5, 4, freqs.size(-1)).to(model.config.params_dtype)
    cos, sin = fn.rope_tables(freqs, t.dtype)
    assert torch.equal(fn.apply_rope(t, cos, sin), rotate(t, freqs, attention))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["qwen", "llama_bias_gelu"])
def test_functional_layer_equals_megatron_modules_bitwise(name, dtype, request):
    model = request.getfixturevalue(name)[dtype]
    assert fn.functional_blockers(model) == []
    layer = model.decoder.layers[1]
    attention = layer.self_attention
    assert attention.linear_qkv.bias is not None  # bias after the matmul
    biased = [m.bias is not None for m in (attention.linear_proj, layer.mlp.linear_fc1, layer.mlp.linear_fc2)]
    assert biased == [name == "llama_bias_gelu"] * 3
    hidden = torch.randn(3, 4, 64).to(model.config.params_dtype)  # [s, b, h]
    freqs = model.rotary_pos_emb(16)[torch.tensor([5, 6, 7])]
    cos, sin = fn.rope_tables(freqs, hidden.dtype)
    w, eps = fn.layer_weights(layer), layer.input_layernorm.eps
    with torch.no_grad():
        q, k, v = attention.get_query_key_value_tensors(layer.input_layernorm(hidden), None)
        want = rotate(q, freqs, attention), rotate(k, freqs, attention), v
        got = fn.attention_in(hidden, w, cos, sin, attention.num_query_groups_per_partition,
                              attention.hidden_size_per_attention_head, eps)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a, b)
        attn = torch.randn(3, 4, q.size(2) * q.size(3)).to(hidden.dtype)
        mid = bias_add(attention.linear_proj(attn), hidden)
        want_out = bias_add(layer.mlp(layer.pre_mlp_layernorm(mid)), mid)
        assert torch.equal(fn.attention_out_mlp(attn, hidden, w, eps, fn.mlp_activation(model.config)), want_out)


def test_decode_attention_masks_by_additive_bias():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 8, generator=g)
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    allowed = torch.tensor([[True, True, True, False, False], [False, True, True, True, True]])
    out = fn.decode_attention(q, k, v, fn.attention_bias(allowed, q.dtype), 0.3).view(2, 4, 8)
    for row in range(2):
        for head in range(4):
            keys = k[row, head // 2][allowed[row]]  # group-major: heads 0, 1 -> group 0
            p = torch.softmax(keys @ q[0, row, head] * 0.3, dim=0)
            torch.testing.assert_close(out[row, head], p @ v[row, head // 2][allowed[row]], atol=1e-6, rtol=0)


def test_compiled_pieces_trace_as_one_graph_each(qwen):
    """fullgraph=True: a graph break would raise; the 'eager' backend runs the traced graph as is."""
    model = qwen["fp32"]
    attention = model.decoder.layers[0].self_attention
    compiled, eager = DecodeFns.build("eager"), DecodeFns.build(None)
    normed = torch.randn(1, 4, 64)
    freqs = model.rotary_pos_emb(8)[torch.tensor([3])]
    cos, sin = fn.rope_tables(freqs, normed.dtype)
    w = fn.layer_weights(model.decoder.layers[1])
    args = (normed, w, cos, sin, attention.num_query_groups_per_partition, attention.hidden_size_per_attention_head)
    with torch.no_grad():
        for a, b in zip(compiled.qkv_rope(*args), eager.qkv_rope(*args)):
            assert torch.equal(a, b)
        attn, y = torch.randn(1, 4, 64), torch.randn(1, 4, 2 * w.fc2.size(1))
        assert torch.equal(compiled.attention_out(attn, normed, w), eager.attention_out(attn, normed, w))
        assert torch.equal(compiled.glu(y), eager.glu(y))
        act = eager.glu(y)
        w0 = fn.layer_weights(model.decoder.layers[0])  # another layer: the same graph, other weights
        assert torch.equal(compiled.mlp_out(act, normed, w0), eager.mlp_out(act, normed, w0))
        logits = torch.randn(4, 300)
        t_c, lp_c = compiled.head(logits, 250, 0.0)
        t_e, lp_e = eager.head(logits, 250, 0.0)
        assert torch.equal(t_c, t_e) and torch.equal(lp_c, lp_e)


def test_decode_mlp_runs_the_trainers_fused_swiglu(qwen, monkeypatch):
    """With bias_activation_fusion (on whenever a GPU is present) megatron's MLP calls `fused_bias_swiglu.swiglu`,
    which rounds silu(gate) * up once; the decode step must call the same function, not its own two-rounding
    glu. A stand-in for the compiled kernel (its one-rounding arithmetic, eager) shows which one runs."""
    from megatron.core.fusions import fused_bias_swiglu

    def one_rounding(y):
        gate, up = torch.chunk(y.float(), 2, -1)
        return (F.silu(gate) * up).to(y.dtype)

    monkeypatch.setattr(fused_bias_swiglu, "swiglu", one_rounding)
    model = qwen["bf16"]
    layer = model.decoder.layers[0]
    monkeypatch.setattr(model.config, "bias_activation_fusion", True)
    fns = DecodeFns.build(None)
    assert fns.activation(model.config) is fn.fused_swiglu
    hidden = torch.randn(1, 6, 64).to(torch.bfloat16)
    attn = torch.randn(1, 6, 64).to(torch.bfloat16)
    w, eps = fn.layer_weights(layer), layer.input_layernorm.eps
    with torch.no_grad():
        mid = bias_add(layer.self_attention.linear_proj(attn), hidden)
        want = bias_add(layer.mlp(layer.pre_mlp_layernorm(mid)), mid)  # megatron's MLP, fused path
        assert torch.equal(fn.attention_out_mlp(attn, hidden, w, eps, fns.activation(model.config)), want)
        assert not torch.equal(fn.attention_out_mlp(attn, hidden, w, eps, fn.unfused_swiglu), want)


def test_decode_mlp_passes_fc1s_bias_to_the_trainers_fused_kernel(mcore_ctx, monkeypatch):
    """A biased SwiGLU under bias_activation_fusion: megatron's MLP calls `bias_swiglu_impl(y, fc1 bias)`; so does
    the decode step (a one-rounding stand-in for the kernel, patched where each looks it up)."""
    from megatron.core.fusions import fused_bias_swiglu
    from megatron.core.transformer import mlp

    def one_rounding(y, bias, *flags):
        gate, up = torch.chunk(y.float() + bias.float(), 2, -1)
        return (F.silu(gate) * up).to(y.dtype)

    for module in (fused_bias_swiglu, mlp):
        monkeypatch.setattr(module, "bias_swiglu_impl", one_rounding)
    model = random_models(mcore_ctx, "llama", attention_bias=True, mlp_bias=True)["bf16"]
    layer = model.decoder.layers[0]
    monkeypatch.setattr(model.config, "bias_activation_fusion", True)
    hidden, attn = (torch.randn(1, 6, 64).to(torch.bfloat16) for _ in range(2))
    w, eps = fn.layer_weights(layer), layer.input_layernorm.eps
    with torch.no_grad():
        mid = bias_add(layer.self_attention.linear_proj(attn), hidden)
        want = bias_add(layer.mlp(layer.pre_mlp_layernorm(mid)), mid)
        assert torch.equal(fn.attention_out_mlp(attn, hidden, w, eps, DecodeFns.build(None).activation(model.config)),
                           want)
        assert not torch.equal(fn.attention_out_mlp(attn, hidden, w, eps, fn.unfused_swiglu), want)


def test_functional_blockers_name_what_is_missing(qwen):
    model = qwen["fp32"]
    model.config.rotary_interleaved = True
    try:
        assert fn.functional_blockers(model) == ["rotary_interleaved"]
    finally:
        model.config.rotary_interleaved = False


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_sample_plain_logprob_is_log_softmax(temperature):
    logits = mask_padded_vocab(torch.randn(16, 300, generator=torch.Generator().manual_seed(1)) * 3, 250)
    tokens, logp = sample_plain(logits, temperature)
    assert bool((tokens < 250).all())
    torch.testing.assert_close(logp, token_logprobs(logits, tokens, temperature), atol=1e-6, rtol=0)
    if temperature == 0.0:
        assert torch.equal(tokens, logits.argmax(-1))


def test_gumbel_argmax_by_hand():
    scaled = torch.tensor([[0.0, 1.0, -float("inf")]])
    # -log(-log u): u = e^-1 -> 0; u = e^-e -> -1 (so id 0 scores 0, id 1 scores 0); u ~ 1 cannot lift -inf
    u = torch.tensor([[torch.exp(torch.tensor(-1.0)).item(), 0.5, 1 - 2**-24]])
    assert gumbel_argmax(scaled, u).item() == 1  # 1 + 0.3665 > 0
    u2 = torch.tensor([[0.9, 0.0, 0.5]])  # u = 0 never wins
    assert gumbel_argmax(scaled, u2).item() == 0


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sample_plain_frequencies_follow_softmax(temperature):
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    logits = probs.log().expand(50_000, 5)
    torch.manual_seed(4)
    tokens, _ = sample_plain(logits, temperature)
    freq = torch.bincount(tokens, minlength=5).float() / tokens.numel()
    want = torch.softmax(probs.log() / temperature, dim=0)
    torch.testing.assert_close(freq, want, atol=0.01, rtol=0)
    assert freq[4] == 0


def test_head_plain_masks_padded_vocab():
    hidden, weight = torch.randn(64, 8), torch.randn(12, 8)
    weight[10:] = 100 * hidden.mean(0)  # padded ids with the largest logits
    tokens, _ = head_plain(hidden @ weight.t(), 10, 1.0)
    assert bool((tokens < 10).all())


@pytest.mark.gpu
def test_inductor_pieces_equal_eager_bitwise_on_gpu():
    """What the static decoder compiles rounds as eager does (bf16, the Qwen2.5-0.5B shape at batch 512), so
    the compiled decode step computes what the trainer's eager modules compute. A failure names the piece."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)
    h, heads, groups, d, ffn, b = 896, 14, 2, 64, 4864, 512
    w = fn.LayerWeights(r(h), r((heads + 2 * groups) * d, h, scale=0.03), r((heads + 2 * groups) * d, scale=0.1),
                        r(h, heads * d, scale=0.03), r(h), r(2 * ffn, h, scale=0.03), r(h, ffn, scale=0.02))
    angles = torch.rand(1, 1, 1, d, generator=g, device="cuda") * 100
    cos, sin = fn.rope_tables(angles, torch.bfloat16)
    normed, attn, y = r(1, b, h), r(1, b, heads * d), r(1, b, 2 * ffn, scale=2.0)
    compiled, eager = DecodeFns.build("inductor"), DecodeFns.build(None)
    with torch.no_grad():
        for name, args in (("qkv_rope", (normed, w, cos, sin, groups, d)), ("attention_out", (attn, normed, w)),
                           ("glu", (y,)), ("mlp_out", (y[..., :ffn], normed, w))):
            got, want = getattr(compiled, name)(*args), getattr(eager, name)(*args)
            for a, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert torch.equal(a, e), f"{name}: {(a != e).float().mean().item():.2e} of the elements differ"


def test_auto_decode_attention_takes_sdpa_only_where_the_probe_finds_it_exact(monkeypatch):
    monkeypatch.setattr(fn.kernel, "HAS_TRITON", True)
    gpu = torch.device("cuda")  # only its type is read
    assert fn.pick_decode_attention("auto", gpu, lambda: True)[0] == "sdpa"
    assert fn.pick_decode_attention("auto", gpu, lambda: False)[0] == "triton"
    assert fn.pick_decode_attention("triton", gpu, lambda: True)[0] == "triton"  # asked for: no probe
    assert fn.pick_decode_attention("sdpa", gpu, lambda: False)[0] == "sdpa"
    assert fn.pick_decode_attention("auto", torch.device("cpu"), lambda: False)[0] == "sdpa"


def test_exactness_probe_compares_with_the_trainers_causal_call():
    """The probe is True for a core attention that IS the decode computation at each position (same call per
    query), and False once that attention is off by one ulp in one output element."""
    from rlhf_mcore.rollout.decode_layer import decode_attention, sdpa_is_trainer_exact, step_bias

    heads, groups, d, scale = 4, 2, 16, 0.25

    def causal_by_decode(q, k, v, mask):  # [s, b, H, D] -> [s, b, H * D], one decode call per row and position
        s, b = q.shape[:2]
        cache_k, cache_v = (torch.zeros(b, groups, 384, d) for _ in range(2))
        cache_k[:, :, :s], cache_v[:, :, :s] = k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)
        out = torch.empty(s, b, heads * d)
        for t in range(s):
            for i in range(b):
                pos = torch.tensor([t])
                out[t, i] = decode_attention(q[t, i][None, None], cache_k[i:i + 1], cache_v[i:i + 1],
                                             step_bias(pos, 384, q.dtype), scale)[0, 0]
        return out

    def off_by_an_ulp(q, k, v, mask):
        out = causal_by_decode(q, k, v, mask)
        out[..., 7] = torch.nextafter(out[..., 7], torch.tensor(1e9))
        return out

    assert sdpa_is_trainer_exact(causal_by_decode, heads, groups, d, torch.float32, "cpu", scale)
    assert not sdpa_is_trainer_exact(off_by_an_ulp, heads, groups, d, torch.float32, "cpu", scale)
