"""Packed sequences through megatron's GPTModel without Transformer Engine.

A packed micro-batch (rlhf_mcore.data.packing) is one row of T tokens holding several sequences back to
back. The model needs two things for it to equal the padded computation:
- RoPE positions restarting at every sequence: `enable_position_rope` hooks the model's rotary module so
  its [max_seqlen, 1, 1, d] table is read at the per-token positions ([T, 1, 1, d]), once per forward;
- attention that never crosses a boundary: `packed_attention`, one of PACKED_KERNELS:
  - `varlen`: torch.nn.attention.varlen.varlen_attn (flash-attention varlen; CUDA, bf16/fp16), no padding,
    grouped-query k/v as they are;
  - `flash`: the same aten flash-attention varlen kernels, called directly with is_causal, k/v repeated to
    the query heads (for torch releases whose public varlen_attn rejects causal or grouped-query attention);
  - `sdpa_mask`: SDPA with a block-diagonal causal [T, T] mask built once per micro-batch (CPU, fp32, and
    the fallback): exact, but it computes and masks the whole [T, T] score matrix.
  Each takes a sliding window too (a model's sliding-window layers: keys fewer than `window` tokens back);
  varlen / flash as flash-attention's window_size (window - 1, 0), probed with one.
  On CUDA the first of varlen / flash that matches sdpa_mask on a small probe (forward and gradients) runs.
With Transformer Engine the params say qkv_format="thd" and megatron's TE path does both itself.
Our own path passes qkv_format="sbhd" so megatron keeps [T, 1, h, d] tensors and leaves RoPE to the hook.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams

from rlhf_mcore.logs import log_once
from rlhf_mcore.registry import Registry

log = logging.getLogger(__name__)
PACKED_KERNELS: Registry = Registry("packed attention kernel")


@dataclasses.dataclass
class PackedSeqs(PackedSeqParams):
    """megatron's PackedSeqParams plus the per-token RoPE positions [T] and a per-micro-batch cache."""

    position_ids: torch.Tensor = None
    cache: dict = dataclasses.field(default_factory=dict)


def packed_seq_params(mb: dict, qkv_format: str) -> PackedSeqs:
    cu = mb["cu_seqlens"]
    return PackedSeqs(qkv_format=qkv_format, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=mb["max_seqlen"],
                      max_seqlen_kv=mb["max_seqlen"], position_ids=mb["position_ids"][0])


def enable_position_rope(model) -> None:
    """Make `model`'s rotary table follow PackedSeqs.position_ids while a forward that got packed params runs.

    The positions are cleared when that forward returns (or raises): the native engine's static decoder reads
    `model.rotary_pos_emb(length)` outside any forward, and a table indexed by the last packed micro-batch's
    positions would give its decode slots the wrong rotary angles whenever it re-allocates its state after a
    packed pass (a cause that fits an H200 run whose rollout/trainer gap grew from 0.025 to 0.6 with packing)."""
    state = {"positions": None}

    def before(module, args, kwargs):
        params = kwargs.get("packed_seq_params")
        use = isinstance(params, PackedSeqs) and params.qkv_format != "thd"
        state["positions"] = params.position_ids if use else None

    def clear(*_):
        state["positions"] = None

    def after(module, args, output):
        return output if state["positions"] is None else output[state["positions"]]

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(clear, always_call=True)
    model.rotary_pos_emb.register_forward_hook(after)


def segment_causal_mask(cu_seqlens: torch.Tensor, total: int, window: int | None = None) -> torch.Tensor:
    """[T, T] bool, True = may attend: same segment and not in the future (and, with a sliding `window`, fewer
    than `window` tokens back).

    >>> segment_causal_mask(torch.tensor([0, 2, 3]), 3).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    >>> segment_causal_mask(torch.tensor([0, 3]), 3, window=2).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    pos = torch.arange(total, device=cu_seqlens.device)
    seg = torch.searchsorted(cu_seqlens[1:].long(), pos, right=True)
    back = pos.unsqueeze(1) - pos.unsqueeze(0)  # [T, T] query position - key position
    allowed = (seg.unsqueeze(1) == seg.unsqueeze(0)) & (back >= 0)
    return allowed if window is None else allowed & (back < window)


@PACKED_KERNELS.register("sdpa_mask")
def sdpa_mask_attention(q, k, v, params: PackedSeqs, scale: float, window: int | None = None) -> torch.Tensor:
    """q [T, np, hn], k/v [T, ng, hn] -> [T, np, hn] through SDPA with the block-diagonal causal mask.

    The mask is one additive [T, T] bias per micro-batch and window, shared by every layer (a boolean mask would
    be converted, and kept for backward, once per layer), its rows padded to 16 elements for the kernels."""
    mask = params.cache.get(("mask", q.dtype, window))
    if mask is None:
        total = q.size(0)
        bias = torch.zeros(total, -(-total // 16) * 16, dtype=q.dtype, device=q.device)[:, :total]
        mask = bias.masked_fill_(~segment_causal_mask(params.cu_seqlens_q, total, window), float("-inf"))
        params.cache[("mask", q.dtype, window)] = mask
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, T, hn]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.size(1) != k.size(1))
    return out[0].transpose(0, 1)


@functools.lru_cache(maxsize=None)
def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, ()
    return varlen_attn, tuple(inspect.signature(varlen_attn).parameters)


@PACKED_KERNELS.register("varlen")
def varlen_attention(q, k, v, params: PackedSeqs, scale: float, window: int | None = None) -> torch.Tensor:
    """Flash-attention varlen through torch (its keyword set changed across torch releases)."""
    fn, names = _varlen_fn()
    kwargs = {}
    if window is not None and "window_size" not in names:
        raise NotImplementedError("this torch's varlen_attn takes no window_size")
    if window is not None or "is_causal" not in names:
        kwargs["window_size"] = (-1 if window is None else window - 1, 0)
    else:
        kwargs["is_causal"] = True
    if "scale" in names:
        kwargs["scale"] = scale
    elif scale != 1.0 / math.sqrt(q.size(-1)):
        q = q * (scale * math.sqrt(q.size(-1)))
    if k.size(1) != q.size(1) and "enable_gqa" in names:
        kwargs["enable_gqa"] = True
    # Otherwise GQA goes in as is: the flash kernels read k/v heads per query group (no [T, np, hn] copies of
    # k and v kept for backward); a torch whose varlen_attn rejects that fails the probe, and `flash` runs.
    cu, longest = params.cu_seqlens_q, params.max_seqlen_q
    return fn(q, k, v, cu, cu, longest, longest, **kwargs)


class _FlashVarlen(torch.autograd.Function):
    """Causal flash-attention varlen through aten's forward/backward ops (q, k, v: [T, heads, hn])."""

    @staticmethod
    def forward(ctx, q, k, v, cu, longest: int, scale: float, window: int | None):
        reach = {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, 0.0, True, False, scale=scale, **reach)
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.longest, ctx.scale, ctx.reach = longest, scale, reach
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, cu, cu, ctx.longest, ctx.longest, 0.0, True, rng, unused,
            scale=ctx.scale, **ctx.reach)
        return dq, dk, dv, None, None, None, None


@PACKED_KERNELS.register("flash")
def flash_attention(q, k, v, params: PackedSeqs, scale: float, window: int | None = None) -> torch.Tensor:
    if k.size(1) != q.size(1):
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    return _FlashVarlen.apply(q.contiguous(), k.contiguous(), v.contiguous(), params.cu_seqlens_q,
                              params.max_seqlen_q, scale, window)


def _probe(name: str, device: torch.device, dtype: torch.dtype, window: int | None = None) -> bool:
    """Whether kernel `name` runs here and matches sdpa_mask, forward and gradients, on a small GQA pack (within
    a sliding `window` where given). The first packed call is often a forward-only log-prob pass under no_grad:
    the probe needs grad mode."""
    with torch.enable_grad():
        return _probe_with_grad(name, device, dtype, window)


def _probe_with_grad(name: str, device: torch.device, dtype: torch.dtype, window: int | None) -> bool:
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(70, h, 64, device=device, dtype=dtype, generator=g).requires_grad_() for h in (4, 2, 2))
    params = PackedSeqs(cu_seqlens_q=torch.tensor([0, 30, 31, 70], device=device, dtype=torch.int32), max_seqlen_q=39)
    try:
        results = []
        for kernel in (PACKED_KERNELS.get(name), sdpa_mask_attention):
            out = kernel(q, k, v, params, 0.125, window)
            results.append([out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))])
        ok = all((a.float() - b.float()).abs().max() < 5e-2 for a, b in zip(*results))
        if not ok:
            log.warning("packed attention: %s differs from the masked SDPA reference here; not used", name)
        return ok
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        log.warning("packed attention: %s unusable here (%s: %s)", name, type(e).__name__, str(e)[:300])
        return False


@functools.lru_cache(maxsize=None)
def choose_kernel_for(device: torch.device, dtype: torch.dtype, windowed: bool = False) -> str:
    """The packed kernel for this device and dtype (`windowed`: one that also takes a sliding window)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        candidates = (["varlen"] if _varlen_fn()[0] is not None else []) + ["flash"]
        for name in candidates:
            if _probe(name, device, dtype, 7 if windowed else None):
                return name
    return "sdpa_mask"


def choose_packed_kernel(q: torch.Tensor, windowed: bool = False) -> str:
    return choose_kernel_for(q.device, q.dtype, windowed)


def packed_attention(q, k, v, params: PackedSeqs, scale: float, window: int | None = None) -> torch.Tensor:
    """Causal attention within each packed sequence, within the last `window` tokens where given:
    q [T, np, hn], k/v [T, ng, hn] -> [T, np, hn]."""
    name = choose_packed_kernel(q, window is not None)
    log_once(log, f"packed attention {name} {window is not None}", "packed attention: %s (%s, %s%s)", name,
             q.device.type, str(q.dtype).removeprefix("torch."), ", sliding window" if window else "")
    return PACKED_KERNELS.get(name)(q, k, v, params, scale, window)
