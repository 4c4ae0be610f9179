"""Grouped-GEMM experts (models/experts_grouped.py): the torch reference path against megatron's SequentialMLP
(output and every gradient, fp32, with experts that get no tokens), the tiny Qwen3-MoE model with
model.moe_expert_impl=grouped-reference against sequential (logits and parameter gradients) and transformers,
the auto choice, and on a GPU torch._grouped_mm against the reference in bf16."""
import dataclasses

import pytest
import torch

from rlhf_mcore.models.experts_grouped import (
    GroupedExperts,
    expert_impl_for,
    grouped_mm_reference,
    grouped_swiglu,
)
from tests.support.tiny_hf import max_logit_error
from tests.support.tiny_moe import VOCAB, tiny_moe

HIDDEN, FFN, EXPERTS = 16, 8, 6
COUNTS = [3, 0, 5, 1, 0, 7]  # experts 1 and 4 get no tokens


def expert_modules(pgs):
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe.experts import SequentialMLP

    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=2, ffn_hidden_size=32,
                               moe_ffn_hidden_size=FFN, num_moe_experts=EXPERTS, moe_router_topk=2,
                               gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                               add_bias_linear=False, use_cpu_initialization=True, bias_activation_fusion=False)
    spec = get_moe_module_spec(use_te=False, num_experts=EXPERTS).submodules.experts
    torch.manual_seed(0)
    sequential = SequentialMLP(EXPERTS, config, spec.submodules, pg_collection=pgs)
    grouped = GroupedExperts(EXPERTS, config, spec.submodules, pg_collection=pgs, kernel="reference")
    grouped.load_state_dict(sequential.state_dict())
    assert set(dict(grouped.named_parameters())) == set(dict(sequential.named_parameters()))
    return sequential, grouped


def close(a, b, rel: float = 1e-5) -> bool:
    """max |a - b| within `rel` of max |a| (fp32: the two paths differ only in summation order)."""
    return bool((a - b).abs().max() <= rel * a.abs().max() + 1e-12)


def run(module, x, probs, counts):
    x, probs = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out, bias = module(x, torch.tensor(counts), probs)
    assert bias is None
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {k: p.grad.clone() for k, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    return out.detach(), x.grad, probs.grad, grads


def test_reference_equals_sequential_mlp_output_and_grads(mcore_ctx):
    sequential, grouped = expert_modules(mcore_ctx.pgs)
    g = torch.Generator().manual_seed(1)
    x, probs = torch.randn(sum(COUNTS), HIDDEN, generator=g), torch.rand(sum(COUNTS), generator=g)
    want, got = run(sequential, x, probs, COUNTS), run(grouped, x, probs, COUNTS)
    for name, a, b in zip(("output", "d input", "d probs"), want[:3], got[:3]):
        assert close(a, b), f"{name}: {(a - b).abs().max():.2e}"
    assert set(want[3]) == set(got[3])
    for key in want[3]:
        assert close(want[3][key], got[3][key]), key
    for e in (1, 4):  # no tokens: zero gradient, not garbage
        assert not got[3][f"local_experts.{e}.linear_fc1.weight"].any()
    assert got[3]["local_experts.5.linear_fc2.weight"].abs().sum() > 0


def test_grouped_mm_reference_by_hand():
    a = torch.arange(12.).reshape(4, 3)
    b = torch.stack([torch.eye(3), 2 * torch.eye(3)])  # [2, 3, 3]
    out = grouped_mm_reference(a, b, None, [1, 3])
    assert torch.equal(out, torch.cat([a[:1], 2 * a[1:]]))
    weight_grads = grouped_mm_reference(a.t(), torch.ones(4, 1), None, [0, 4])  # [2, 3, 1]
    assert torch.equal(weight_grads[0], torch.zeros(3, 1)) and torch.equal(weight_grads[1, :, 0], a.sum(0))


def test_the_activation_output_carries_gradients_to_fc1_alone():
    """_GroupedSwiGLU returns (y, a); with only `a` used (the fc2 LoRA term's input), fc1 and x get gradients through
    it, equal to autograd through the plain maths, and fc2 gets zeros (an expert no token chose: zeros too)."""
    from rlhf_mcore.models.experts_grouped import GROUPED_MM, _GroupedSwiGLU, expert_offsets, weighted_swiglu

    gen = torch.Generator().manual_seed(0)
    counts, hidden, ffn = [2, 0, 3], 4, 5
    x = torch.randn(5, hidden, generator=gen, requires_grad=True)
    probs = torch.rand(5, generator=gen)
    fc1 = [torch.randn(2 * ffn, hidden, generator=gen, requires_grad=True) for _ in counts]
    fc2 = [torch.randn(hidden, ffn, generator=gen, requires_grad=True) for _ in counts]
    _, a = _GroupedSwiGLU.apply(x, probs, None, expert_offsets(counts, "cpu"), counts, GROUPED_MM.get("reference"),
                                len(counts), *fc1, *fc2)
    (a * torch.arange(a.numel()).view_as(a)).sum().backward()
    got = [x.grad, *(w.grad for w in fc1)]
    for t in (x, *fc1):
        t.grad = None
    rows = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    h = torch.stack([x[i] @ fc1[e].t() for i, e in enumerate(rows.tolist())])
    (weighted_swiglu(h, probs) * torch.arange(a.numel()).view_as(a)).sum().backward()
    for g, want in zip(got, [x.grad, *(w.grad for w in fc1)]):
        assert torch.allclose(g, torch.zeros_like(g) if want is None else want, atol=1e-5)  # None: no token
    assert not got[2].any() and all(not w.grad.any() for w in fc2)


def test_auto_picks_sequential_off_gpu_and_explicit_names_win():
    assert expert_impl_for("auto", torch.device("cpu"), torch.bfloat16)[0] == "sequential"
    assert expert_impl_for("auto", torch.device("cpu"), torch.float32)[0] == "sequential"
    assert expert_impl_for("grouped", torch.device("cpu"), torch.float32) == ("grouped", "model.moe_expert_impl")


def build_tiny(hf_cfg, tmp_path, mcore_ctx, impl):
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_load import load_hf_weights

    model_cfg = dataclasses.replace(ModelConfig(dtype="fp32", attention_backend="sdpa"), moe_expert_impl=impl)
    model = build_model("actor", hf_cfg, model_cfg, ParallelConfig(), mcore_ctx)
    load_hf_weights(model, str(tmp_path), hf_cfg, 0, 1)
    return model


def test_tiny_qwen3_moe_grouped_reference_equals_sequential(tmp_path, mcore_ctx):
    from megatron.core.transformer.moe.experts import SequentialMLP

    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.logprobs import full_logits

    hf = tiny_moe(norm_topk_prob=True)
    hf.save_pretrained(str(tmp_path))
    hf_cfg = read_hf_config(tmp_path)
    models = {impl: build_tiny(hf_cfg, tmp_path, mcore_ctx, impl) for impl in ("sequential", "grouped-reference")}
    experts = {impl: m.decoder.layers[0].mlp.experts for impl, m in models.items()}
    assert type(experts["sequential"]) is SequentialMLP and isinstance(experts["grouped-reference"], GroupedExperts)
    tokens = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(13).unsqueeze(0).expand_as(tokens)
    logits, grads = {}, {}
    for impl, model in models.items():
        out = full_logits(model, model(tokens, pos, None), mcore_ctx.pgs.tp)  # [b, s, V]
        out.log_softmax(-1)[..., 7].sum().backward()
        logits[impl] = out.detach()
        grads[impl] = {k: p.grad for k, p in model.named_parameters()}
    err = (logits["sequential"] - logits["grouped-reference"]).abs().max().item()
    print(f"tiny qwen3-moe logits max |grouped-reference - sequential| = {err:.2e}")
    assert err <= 1e-5
    assert set(grads["sequential"]) == set(grads["grouped-reference"])
    for key, want in grads["sequential"].items():
        assert close(want, grads["grouped-reference"][key], 1e-4), key
    with torch.no_grad():
        models["grouped-reference"].eval()
        assert max_logit_error(hf, models["grouped-reference"], mcore_ctx.pgs.tp, VOCAB) <= 1e-4


@pytest.mark.gpu
def test_grouped_mm_matches_reference_in_bf16_on_gpu():
    """torch._grouped_mm against the per-expert loop, both bf16, each against an fp32 loop on the same inputs:
    the grouped kernel's error is no larger than the loop's own bf16 error (plus a small floor)."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    dev, g = torch.device("cuda"), torch.Generator().manual_seed(0)
    counts = [37, 0, 128, 1, 0, 300, 64, 17]  # zero-token experts included
    hidden, ffn = 256, 128
    x = torch.randn(sum(counts), hidden, generator=g)
    probs = torch.rand(sum(counts), generator=g)
    fc1 = [torch.randn(2 * ffn, hidden, generator=g) * 0.05 for _ in counts]
    fc2 = [torch.randn(hidden, ffn, generator=g) * 0.05 for _ in counts]
    grad_out = torch.randn(sum(counts), hidden, generator=g)

    def outputs(kernel, dtype):
        leaves = [t.to(dev, dtype).requires_grad_() for t in (x, *fc1, *fc2)]
        p = probs.to(dev).requires_grad_()
        y = grouped_swiglu(leaves[0], p, counts, leaves[1:1 + len(counts)], leaves[1 + len(counts):], kernel)
        y.backward(grad_out.to(dev, dtype))
        return [y.float(), leaves[0].grad.float(), p.grad.float(),
                *[w.grad.float() for w in leaves[1:]]]

    exact = outputs("reference", torch.float32)
    loop, grouped = outputs("reference", torch.bfloat16), outputs("grouped_mm", torch.bfloat16)
    for i, (e, lo, gr) in enumerate(zip(exact, loop, grouped)):
        scale = e.abs().max().clamp_min(1e-6)
        err_loop, err_grouped = (lo - e).abs().max() / scale, (gr - e).abs().max() / scale
        assert err_grouped <= 2 * err_loop + 2e-3, f"tensor {i}: grouped {err_grouped:.2e} loop {err_loop:.2e}"
    for e in (1, 4):  # no tokens: the weight gradients are zero
        assert not grouped[3 + e].any() and not grouped[3 + len(counts) + e].any()
