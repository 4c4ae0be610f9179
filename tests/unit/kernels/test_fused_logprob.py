"""Fused chunked log-prob / entropy against the full-logits reference: values and gradients.

CPU tests run the torch path. `-m gpu` tests run the Triton path (and the torch path on CUDA);
tolerances: fp32 atol 1e-4 / rtol 1e-4; bf16 (cuBLAS fp32 logits of bf16 inputs vs the fp32 reference)
atol 1e-3 / rtol 1e-3 on values and 3e-2 relative L2 error on gradients (dL/dlogits is cast to bf16).
"""
import pytest
import torch
from rlhf_mcore.kernels.fused_logprob import HAS_TRITON, fused_logprob_entropy, reference_logprob_entropy


def problem(n=37, h=16, v=101, dtype=torch.float64, device="cpu", seed=0, scale=1.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * scale).to(device=device, dtype=dtype)
    weight = (torch.randn(v, h, generator=g) * scale).to(device=device, dtype=dtype)
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    coef = torch.randn(2, n, generator=g, dtype=torch.float64).to(device)  # upstream grads for logp, entropy
    return hidden, weight, targets, coef


def values_and_grads(fn, hidden, weight, targets, coef, **kw):
    hidden = hidden.detach().clone().requires_grad_(True)
    weight = weight.detach().clone().requires_grad_(True)
    logp, entropy = fn(hidden, weight, targets, **kw)
    ((logp.double() * coef[0]).sum() + (entropy.double() * coef[1]).sum()).backward()
    return logp.detach(), entropy.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("chunk_size", [1, 8, 37, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_reference_fp64(chunk_size, temperature):
    args = problem()
    fused = values_and_grads(fused_logprob_entropy, *args, temperature=temperature, chunk_size=chunk_size)
    ref = values_and_grads(reference_logprob_entropy, *args, temperature=temperature)
    for got, want in zip(fused, ref):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_temperature_zero_scores_greedy_samples_at_one():
    """rollout.temperature=0 (greedy training samples) scores them at T = 1, as the sampler does (it divided by
    zero before)."""
    args = problem()
    greedy = values_and_grads(fused_logprob_entropy, *args, temperature=0.0, chunk_size=8)
    for got, want in zip(greedy, values_and_grads(reference_logprob_entropy, *args, temperature=1.0)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_fp32_outputs_and_tolerance():
    hidden, weight, targets, coef = problem(dtype=torch.float32)
    fused = values_and_grads(fused_logprob_entropy, hidden, weight, targets, coef, chunk_size=16)
    ref = values_and_grads(reference_logprob_entropy, hidden, weight, targets, coef)
    assert fused[0].dtype == torch.float32 and fused[1].dtype == torch.float32
    for got, want in zip(fused, ref):
        torch.testing.assert_close(got, want.to(got.dtype), atol=1e-5, rtol=1e-5)


def test_bf16_uses_fp32_logits_like_the_reference():
    """bf16 inputs with trained-LM-sized logits (~20, bf16 ulp 0.125): the chunk logits are never rounded to
    bf16, so values match the upcast reference to fp32 summation order, gradients to one bf16 rounding."""
    hidden, weight, targets, coef = problem(n=64, h=32, v=300, dtype=torch.float32)
    weight[:, 0] += 20.0 / hidden[:, 0].abs().mean()  # a shift common to every logit of a row
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    fused = values_and_grads(fused_logprob_entropy, hidden, weight, targets, coef, chunk_size=16)
    ref = values_and_grads(reference_logprob_entropy, hidden, weight, targets, coef)
    torch.testing.assert_close(fused[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused[1], ref[1], atol=1e-5, rtol=1e-5)
    assert fused[2].dtype == torch.bfloat16 and rel_err(fused[2], ref[2]) < 1e-2 and rel_err(fused[3], ref[3]) < 1e-2


def test_gradcheck_both_outputs():
    hidden, weight, targets, _ = problem(n=5, h=3, v=7)
    fn = lambda h, w: fused_logprob_entropy(h, w, targets, temperature=0.9, chunk_size=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden.requires_grad_(), weight.requires_grad_()))


def test_reference_is_a_real_distribution():
    hidden, weight, targets, _ = problem(n=4, v=9)
    logits = hidden @ weight.t()
    logp, entropy = reference_logprob_entropy(hidden, weight, targets)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1)[torch.arange(4), targets])
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy, -(p * p.log()).sum(-1))


def test_only_logp_used_and_frozen_hidden():
    hidden, weight, targets, coef = problem()
    w = weight.clone().requires_grad_(True)
    logp, _ = fused_logprob_entropy(hidden, w, targets, chunk_size=10)  # entropy unused: zero upstream grad
    (logp * coef[0]).sum().backward()
    w_ref = weight.clone().requires_grad_(True)
    (reference_logprob_entropy(hidden, w_ref, targets)[0].double() * coef[0]).sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad, atol=1e-10, rtol=1e-10)
    assert not hidden.requires_grad


def test_target_on_no_shard_gives_minus_logsumexp():
    hidden, weight, targets, _ = problem(n=3, v=11)
    targets = targets.clone()
    targets[1] = -100
    logp, _ = fused_logprob_entropy(hidden, weight, targets)
    assert logp[1].item() == pytest.approx(-torch.logsumexp(hidden[1] @ weight.t(), -1).item())


def test_shape_errors():
    hidden, weight, targets, _ = problem()
    with pytest.raises(ValueError, match="weight"):
        fused_logprob_entropy(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="targets"):
        fused_logprob_entropy(hidden, weight, targets[:3])


# ----------------------------------------------------------------------------- GPU (make test-gpu)
def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_gpu_fp32_matches_reference(backend):
    if backend == "triton" and not HAS_TRITON:
        pytest.skip("triton not installed")
    args = problem(n=1000, h=64, v=5003, dtype=torch.float32, device="cuda", scale=0.5)
    fused = values_and_grads(fused_logprob_entropy, *args, temperature=0.8, chunk_size=256, backend=backend)
    ref = values_and_grads(reference_logprob_entropy, *args, temperature=0.8)
    for got, want in zip(fused, ref):
        torch.testing.assert_close(got.float(), want.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_gpu_bf16_triton_matches_reference_and_torch_path():
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    args = problem(n=2048, h=256, v=32000, dtype=torch.bfloat16, device="cuda", scale=0.25)
    tri = values_and_grads(fused_logprob_entropy, *args, chunk_size=512, backend="triton")
    ref = values_and_grads(reference_logprob_entropy, *args)
    assert tri[0].dtype == torch.float32 and tri[2].dtype == torch.bfloat16
    torch.testing.assert_close(tri[0], ref[0], atol=1e-3, rtol=1e-3)  # fp32 logits: no bf16 rounding
    torch.testing.assert_close(tri[1], ref[1], atol=1e-3, rtol=1e-3)
    assert rel_err(tri[2], ref[2]) < 3e-2 and rel_err(tri[3], ref[3]) < 3e-2
    torch_path = values_and_grads(fused_logprob_entropy, *args, chunk_size=512, backend="torch")
    torch.testing.assert_close(tri[0], torch_path[0], atol=1e-3, rtol=1e-3)  # same fp32 logits, same maths
    torch.testing.assert_close(tri[1], torch_path[1], atol=1e-3, rtol=1e-3)
    assert rel_err(tri[2], torch_path[2]) < 1e-2 and rel_err(tri[3], torch_path[3]) < 1e-2


@pytest.mark.gpu
def test_gpu_triton_on_a_vocab_shard_matches_torch_path():
    """One TP rank's view (no group): rows [1000, 3500) of the vocab, most targets on other shards."""
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    hidden, weight, targets, coef = problem(n=700, h=64, v=5003, dtype=torch.float32, device="cuda", scale=0.5)
    shard = weight[1000:3500]
    kw = dict(vocab_start=1000, temperature=1.3, chunk_size=128)
    tri = values_and_grads(fused_logprob_entropy, hidden, shard, targets, coef, backend="triton", **kw)
    ref = values_and_grads(fused_logprob_entropy, hidden, shard, targets, coef, backend="torch", **kw)
    for got, want in zip(tri, ref):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    on_shard = (targets >= 1000) & (targets < 3500)
    assert 0 < int(on_shard.sum()) < len(targets)
    lse = torch.logsumexp(hidden @ shard.t() / 1.3, -1)
    torch.testing.assert_close(tri[0][~on_shard], -lse[~on_shard], atol=1e-4, rtol=1e-4)
