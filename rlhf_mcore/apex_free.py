"""Megatron-core 0.16.1's optimizer fallbacks on a GPU without apex and Transformer Engine, made fast, in one
place (a sibling of `cpu_compat`, which serves machines without CUDA).

Without TE and apex megatron falls back to Python loops over the parameter tensors (`megatron.core.utils`
local_multi_tensor_*) and to torch's AdamW. For a small model they dominate the optimizer step: the l2-norm
fallback copies each tensor's norm to the host, ~180 host syncs per step for SmolLM2-135M (744 per update of
4 mini-batches, measured with trainer.profile_steps on an H200). `apply_apex_free_patches()` (called by
`trainer.optim.build_train_state`) applies, only with CUDA and only while megatron uses the fallback:
- A1 clip_grads.l2_norm_impl (get_grad_norm_fp32, called by MegatronOptimizer.get_grad_norm): one device
  kernel set (`torch._foreach_norm`), no host copy; the norm of the norms as the fallback computes it.
- A2 clip_grads.multi_tensor_scale_impl and optimizer.multi_tensor_scale_impl (clip_grad_by_total_norm_fp32,
  and _multi_tensor_copy_this_to_that when an overflow buffer is passed): `torch._foreach_mul` / `_foreach_copy_`.
  Clipping passes the same list as source and destination: it scales in place (`_foreach_mul_`), never an fp32
  copy of every gradient (4 bytes a parameter: 28 GiB at 7B, which ran a full 7B update out of an H200's memory).
- A3 optimizer._multi_tensor_copy_this_to_that (Float16OptimizerWithFloat16Params._copy_main_params_to_model_params
  and _copy_model_params_to_main_params): one `_foreach_copy_` instead of a copy per tensor.
`fuse_torch_adam(optimizer)` sets torch AdamW's `fused` flag on megatron's inner optimizers (one fused kernel
per parameter group instead of the foreach chain). Values: the same up to floating-point reduction order
(fused Adam computes the same update formula in one kernel: ~1 ulp of fp32).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

_applied: list[str] | None = None


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """amp_C.multi_tensor_l2norm's contract ((a [1] fp32 tensor on the tensors' device, None)) with no host sync:
    the l2 norm of all tensors of all lists.

    >>> foreach_l2_norm(0, None, [[torch.tensor([3.0]), torch.tensor([0.0, 4.0])]], False)[0]
    tensor([5.])
    """
    tensors = [t for tensor_list in tensor_lists for t in tensor_list]
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack(norms).float()).reshape(1), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """amp_C.multi_tensor_scale's contract: tensor_lists[1][i] = tensor_lists[0][i] * scale (a copy at scale 1).

    >>> src, dst = [torch.tensor([1.0, 2.0])], [torch.zeros(2, dtype=torch.bfloat16)]
    >>> foreach_scale(0, None, [src, dst], 0.5); dst[0].tolist()
    [0.5, 1.0]
    """
    src, dst = tensor_lists[0], tensor_lists[1]
    if not src:
        return
    if all(s is d for s, d in zip(src, dst)):  # clip_grad_by_total_norm_fp32 scales the grads in place
        if scale != 1.0:
            torch._foreach_mul_(dst, scale)
        return
    torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))


def foreach_copy_this_to_that(this, that, overflow_buf=None):
    """megatron's _multi_tensor_copy_this_to_that: that[i] = this[i], in one foreach call."""
    if this:
        torch._foreach_copy_(list(that), list(this))


def apply_apex_free_patches() -> list[str]:
    """Apply A1-A3 where they serve (CUDA, and megatron on its local fallbacks); returns the applied names."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = []
    if not torch.cuda.is_available():
        return _applied  # CPU: no host syncs to save; the fallbacks run as they are (cpu_compat P2)
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2_norm
        _applied.append("A1 grad-norm without host syncs")
    for module in (clip_grads, optimizer):
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
            _applied.append(f"A2 foreach scale ({module.__name__.rsplit('.', 1)[-1]})")
    if getattr(optimizer, "multi_tensor_applier", None) is utils.local_multi_tensor_applier:
        optimizer._multi_tensor_copy_this_to_that = foreach_copy_this_to_that
        _applied.append("A3 foreach param copies")
    if _applied:
        log.info("apex and TE absent: megatron-core optimizer fallbacks replaced by foreach kernels (%s; "
                 "rlhf_mcore/apex_free.py)", ", ".join(_applied))
    return _applied


def inner_optimizers(optimizer) -> list:
    """The torch optimizers inside a megatron optimizer (chained or not)."""
    return [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def fuse_torch_adam(optimizer) -> bool:
    """Switch megatron's torch Adam/AdamW (the optimizer without apex and TE) to torch's fused kernel when
    every parameter is on a CUDA device. Before the first step (the step counters are then made on the device).
    Returns whether it did."""
    inner = [o for o in inner_optimizers(optimizer) if isinstance(o, (torch.optim.Adam, torch.optim.AdamW))]
    params = [p for o in inner for g in o.param_groups for p in g["params"]]
    if not inner or not params or not all(p.is_cuda and p.is_floating_point() for p in params):
        return False
    for o in inner:
        for group in o.param_groups:
            group["fused"], group["foreach"] = True, False
    return True
