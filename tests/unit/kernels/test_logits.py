"""fp32 LM-head logits: never rounded to the inputs' bf16 / fp16 (CPU: the upcast matmul, bitwise; `-m gpu`:
cuBLAS with an fp32 output against the upcast matmul, and the compiled sampling head against the eager one)."""
import doctest

import pytest
import rlhf_mcore.kernels.logits as logits_mod
import torch
from rlhf_mcore.kernels.logits import logits_fp32


def test_doctests():
    assert doctest.testmod(logits_mod).failed == 0


def trained_like(dtype=torch.bfloat16, device="cpu", n=64, h=48, v=300):
    """Hidden states and a weight whose logits are ~10-30 (a trained LM's), where a bf16 ulp is 0.0625-0.125."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g) * 0.3
    weight[:, 0] += 20.0 / hidden[:, 0].abs().mean()  # a component common to every row: large logits
    return hidden.to(device, dtype), weight.to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_equals_the_upcast_matmul_bitwise_and_keeps_what_bf16_rounds(dtype):
    hidden, weight = trained_like(dtype)
    got = logits_fp32(hidden, weight)
    want = hidden.float() @ weight.float().t()
    assert got.dtype == torch.float32 and got.shape == (64, 300)
    assert torch.equal(got, want)
    rounded = torch.matmul(hidden, weight.t()).float()
    assert (rounded != got).float().mean() > 0.5  # the bf16 / fp16 output matmul rounds most of them
    torch.testing.assert_close(rounded, got, atol=0.0, rtol=2 ** -7)  # ... by at most half an ulp (+ order)


def test_leading_dims_fp32_fp64_and_mixed_inputs():
    hidden, weight = trained_like()
    batched = logits_fp32(hidden.view(4, 16, 48), weight)
    assert batched.shape == (4, 16, 300) and torch.equal(batched.view(64, 300), logits_fp32(hidden, weight))
    for dtype in (torch.float32, torch.float64):
        h, w = hidden.to(dtype), weight.to(dtype)
        out = logits_fp32(h, w)
        assert out.dtype == dtype and torch.equal(out, h @ w.t())
    mixed = logits_fp32(hidden.float(), weight)  # fp32 activations, bf16 weight: upcast, no rounding
    assert mixed.dtype == torch.float32 and torch.equal(mixed, hidden.float() @ weight.float().t())


def test_autograd_flows_to_both_inputs():
    hidden, weight = (t.requires_grad_() for t in trained_like(n=5, h=4, v=7))
    logits_fp32(hidden, weight).sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    torch.testing.assert_close(hidden.grad.float(), weight.float().sum(0).expand(5, 4), atol=0, rtol=2 ** -8)


# ----------------------------------------------------------------------------- GPU (make test-gpu)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_out_dtype_matches_the_upcast_matmul(dtype):
    """cuBLAS bf16 x bf16 -> fp32 (torch.mm out_dtype) is the upcast fp32 GEMM up to summation order."""
    hidden, weight = trained_like(dtype, "cuda", n=1000, h=512, v=5003)
    with torch.no_grad():
        got = logits_fp32(hidden, weight)
    want = hidden.double() @ weight.double().t()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-5)  # |logits| ~ 20, fp32 sums of 512
    rounded = torch.matmul(hidden, weight.t()).double()
    assert (got.double() - want).abs().mean() < (rounded - want).abs().mean() / 50


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_gpu_compiled_head_matches_eager_head(temperature):
    """The decode step's head, compiled by inductor, on fp32 logits from `logits_fp32` (the GEMM stays eager):
    the eager head's greedy tokens and log-probs; sampled tokens from the same seed agree in law (one RNG each)."""
    from rlhf_mcore.rollout.static_decode import DecodeFns

    hidden, weight = trained_like(torch.bfloat16, "cuda", n=256, h=512, v=5003)
    with torch.no_grad():
        logits = logits_fp32(hidden, weight)
        compiled, eager = DecodeFns.build("inductor").head, DecodeFns.build(None).head
        t_c, lp_c = compiled(logits, 5000, temperature)
        t_e, lp_e = eager(logits, 5000, temperature)
    assert bool((t_c < 5000).all()) and lp_c.dtype == torch.float32
    if temperature == 0.0:
        assert torch.equal(t_c, t_e)
        torch.testing.assert_close(lp_c, lp_e, atol=1e-5, rtol=0)
    else:  # the log-prob of each token sampled is the same function of the logits in both
        want = torch.log_softmax(logits[:, :5000] / temperature, -1).gather(1, t_c[:, None]).squeeze(1)
        torch.testing.assert_close(lp_c, want, atol=1e-4, rtol=0)
