"""rlhf_mcore/apex_free.py: the foreach replacements of megatron's apex-free optimizer fallbacks compute what the
fallbacks compute (megatron.core.utils.local_multi_tensor_*), and the fused torch AdamW takes the foreach
AdamW's steps (GPU)."""
import pytest
import torch

from rlhf_mcore.apex_free import (
    apply_apex_free_patches,
    foreach_copy_this_to_that,
    foreach_l2_norm,
    foreach_scale,
    fuse_torch_adam,
)


def tensors(seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for shape in ((7,), (3, 5), (1,), (64, 33))]


def test_l2_norm_equals_megatrons_fallback(mcore_ctx):
    from megatron.core.utils import local_multi_tensor_l2_norm

    grads = tensors(0)
    ours, _ = foreach_l2_norm(0, None, [grads], False)
    theirs, _ = local_multi_tensor_l2_norm(0, None, [grads], False)
    by_hand = torch.cat([g.flatten() for g in grads]).double().norm()
    assert ours.shape == theirs.shape == (1,) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs.to(ours.device), rtol=1e-6, atol=0)
    assert abs(ours.item() - by_hand.item()) <= 1e-6 * by_hand.item()


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_scale_equals_megatrons_fallback_across_dtypes(scale):
    from megatron.core.utils import local_multi_tensor_scale

    src = tensors(1)
    ours, theirs = tensors(2, torch.bfloat16), tensors(2, torch.bfloat16)
    foreach_scale(0, None, [src, ours], scale)
    local_multi_tensor_scale(0, None, [src, theirs], scale)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert torch.equal(ours[3], (src[3] * scale).to(torch.bfloat16))


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_clipping_scales_in_place_without_a_copy(scale, monkeypatch):
    """clip_grad_by_total_norm_fp32 passes [grads, grads]: the same values as megatron's fallback, written into
    the grads' own storage, and no out-of-place foreach product (a full fp32 copy of the gradients)."""
    from megatron.core.utils import local_multi_tensor_scale

    grads, theirs = tensors(6), tensors(6)
    storage = [g.data_ptr() for g in grads]
    local_multi_tensor_scale(0, None, [theirs, theirs], scale)

    def no_copy(*args, **kwargs):
        raise AssertionError("torch._foreach_mul (out of place) called while clipping")
    monkeypatch.setattr(torch, "_foreach_mul", no_copy)
    foreach_scale(0, None, [grads, grads], scale)
    assert all(torch.equal(a, b) for a, b in zip(grads, theirs))
    assert [g.data_ptr() for g in grads] == storage


def test_param_copies_equal_the_loop():
    this, that = tensors(3, torch.bfloat16), tensors(4)
    foreach_copy_this_to_that(this, that)
    assert all(torch.equal(b, a.float()) for a, b in zip(this, that))


def test_nothing_changes_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    params = [torch.nn.Parameter(t) for t in tensors(5)]
    adam = torch.optim.AdamW(params, lr=1e-3)
    assert apply_apex_free_patches() == []
    assert not fuse_torch_adam(adam) and adam.param_groups[0]["fused"] is None


@pytest.mark.gpu
def test_fused_adam_takes_the_foreach_steps():
    """Three AdamW steps on the same gradients, foreach vs fused (what fuse_torch_adam switches to): the same
    weights within fp32 rounding."""
    runs = []
    for fused in (False, True):
        params = [torch.nn.Parameter(t.cuda()) for t in tensors(6)]
        adam = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        if fused:
            assert fuse_torch_adam(adam) and adam.param_groups[0]["fused"]
        for step in range(3):
            for p, g in zip(params, tensors(10 + step)):
                p.grad = g.cuda()
            adam.step()
        runs.append([p.detach() for p in params])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
