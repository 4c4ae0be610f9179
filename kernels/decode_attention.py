"""Decode attention: one new query per row against a static KV cache, split over the keys (flash-decoding).

    out = decode_attention(q [b, H, D], k [b, G, T, D], v [b, G, T, D], key_valid [b, T] bool or None,
                           pos [] or [b] long, scale)  -> [b, H, D]

Row i's query head h attends to the cached keys t of group g = h // (H / G) (megatron's group-major head
order) with t <= pos (pos[i] when pos is per row: the native engine's rows sit at the slots of the trainer's
columns, so each has its own) and key_valid[i, t] (None: every slot): softmax(scale * q . k) v, fp32 softmax
statistics, probabilities rounded to the input dtype before the product with v (as flash attention does), output
in the input dtype.

Why a kernel: torch 2.11 sends this shape (7 query heads per key group, one position) to cuDNN's flash
kernel, which pads the queries to a full tile and reads the whole allocated cache, ~63 us per layer at
b 512, T 384 on an H200 (benchmarks/2026-12-01-rollout). Here one program per (row, group, key split) loads the
group's rep query heads as one [16, D] tile, so each cached key is read once for all of them, and stops at
its row's `pos`: slots not yet decoded are never read. When rows x groups are too few to fill the GPU, the keys are
split and a second kernel merges the partial softmaxes. `pos` and `key_valid` are read on the device, so
one captured CUDA graph serves every step.

The trainer's attention numbers: on an H200 (torch 2.11) SDPA runs the trainer's causal forward and a masked
decode query on cuDNN's flash kernel, with identical outputs. This kernel reproduces them: with 128-key tiles
aligned at slot 0, visited in order, fp32 statistics as here, 99.99%+ of its bf16 outputs equal cuDNN's
bitwise (64-key tiles: 94%; reversed order: 85%; an fma in the exponent: 99.98%; measured at b 512, T 384,
SmolLM2 and Qwen2.5-0.5B heads, benchmarks/2026-12-01-rollout). A split merges partial softmaxes in another order,
so rows are only split when a split still reads MIN_SPLIT keys (long caches, few rows).

`reference_decode_attention` is the plain-torch definition the tests compare against.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only installs
    HAS_TRITON = False

BLOCK_T = 128  # keys per tile: cuDNN's, so that one split sums in the trainer's order (see the module doc)
MIN_SPLIT = 512  # keys per split at least: below it one program reads all of a row's keys (exact)
MIN_QUERY_ROWS = 16  # tl.dot's smallest M: the rep query heads of a group are padded to this


def reference_decode_attention(q: Tensor, k: Tensor, v: Tensor, key_valid: Optional[Tensor], pos: Tensor,
                               scale: float) -> Tensor:
    """The definition, in fp32 then rounded to q's dtype. q [b, H, D], k / v [b, G, T, D], key_valid [b, T]
    bool or None, pos [] or [b] long -> [b, H, D]. A row with no allowed key gives zeros."""
    b, heads, d = q.shape
    groups, length = k.size(1), k.size(2)
    allowed = torch.arange(length, device=q.device) <= pos.view(-1, 1)  # [b or 1, T]
    allowed = allowed.expand(b, length) if key_valid is None else allowed & key_valid
    qg = q.float().view(b, groups, heads // groups, d)  # [b, G, rep, D]
    scores = torch.einsum("bgrd,bgtd->bgrt", qg, k.float()) * scale
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # [b, G, rep, T]
    out = torch.einsum("bgrt,bgtd->bgrd", probs, v.float())
    return out.reshape(b, heads, d).to(q.dtype)


def num_splits(rows: int, length: int, num_sms: int) -> int:
    """Key splits per (row, group) so that rows x splits programs fill the GPU about twice over, each split
    reading at least MIN_SPLIT keys (so caches of up to MIN_SPLIT slots are never split).

    >>> num_splits(1024, 384, 132), num_splits(16, 384, 132), num_splits(1, 4096, 132), num_splits(64, 2048, 132)
    (1, 1, 8, 4)
    """
    return max(1, min(math.ceil(2 * num_sms / max(rows, 1)), math.ceil(length / MIN_SPLIT)))


if HAS_TRITON:

    @triton.jit
    def _split_kernel(q_ptr, k_ptr, v_ptr, valid_ptr, pos_ptr, out_ptr, part_ptr, m_ptr, denom_ptr,
                      sq_b, sq_h, sk_b, sk_g, sk_t, sv_b, sv_g, sv_t, s_valid, s_pos, so_b,
                      groups, rep, chunk, qk_scale,
                      REP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BLOCK: tl.constexpr,
                      SPLITS: tl.constexpr, IEEE: tl.constexpr, HAS_VALID: tl.constexpr):
        """Program (row * groups + g, split): online softmax over keys [split * chunk, ..) up to the row's pos.
        SPLITS == 1 writes the normalised output; else the unnormalised partial and its (max, sum)."""
        rg = tl.program_id(0)
        split = tl.program_id(1)
        row = rg // groups
        g = rg % groups
        r = tl.arange(0, REP_P)
        d = tl.arange(0, D_P)
        t = tl.arange(0, BLOCK)
        q = tl.load(q_ptr + row * sq_b + (g * rep + r)[:, None] * sq_h + d[None, :],
                    mask=(r[:, None] < rep) & (d[None, :] < D), other=0.0)  # [REP_P, D_P]
        hi = tl.load(pos_ptr + row * s_pos) + 1
        lo = split * chunk
        hi = tl.minimum(hi, lo + chunk)
        m = tl.full([REP_P], float("-inf"), tl.float32)
        denom = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D_P], tl.float32)
        k_base = k_ptr + row * sk_b + g * sk_g
        v_base = v_ptr + row * sv_b + g * sv_g
        for start in range(lo, hi, BLOCK):
            ts = start + t
            in_range = ts < hi
            keep = in_range
            if HAS_VALID:
                keep = keep & (tl.load(valid_ptr + row * s_valid + ts, mask=in_range, other=0) != 0)
            kv_mask = in_range[:, None] & (d[None, :] < D)
            k = tl.load(k_base + ts[:, None] * sk_t + d[None, :], mask=kv_mask, other=0.0)  # [BLOCK, D_P]
            if IEEE:  # fp32 inputs: full fp32 products (tl.dot would round them to tf32)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            else:
                s = tl.dot(q, tl.trans(k)) * qk_scale  # [REP_P, BLOCK], log2 units
            s = tl.where(keep[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            denom = denom * alpha + tl.sum(p, 1)
            v = tl.load(v_base + ts[:, None] * sv_t + d[None, :], mask=kv_mask, other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        if SPLITS == 1:
            out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
            tl.store(out_ptr + row * so_b + (g * rep + r)[:, None] * D + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=(r[:, None] < rep) & (d[None, :] < D))
        else:
            out_rows = (rg * SPLITS + split) * REP_P + r
            tl.store(part_ptr + out_rows[:, None] * D_P + d[None, :], acc)
            tl.store(m_ptr + out_rows, m)
            tl.store(denom_ptr + out_rows, denom)

    @triton.jit
    def _merge_kernel(part_ptr, m_ptr, denom_ptr, out_ptr, groups, rep, so_b,
                      REP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, SPLITS: tl.constexpr):
        """Program rg: merge the SPLITS partial softmaxes of (row, group) rg into its rep output heads."""
        rg = tl.program_id(0)
        r = tl.arange(0, REP_P)
        d = tl.arange(0, D_P)
        m = tl.full([REP_P], float("-inf"), tl.float32)
        for s in range(SPLITS):
            m = tl.maximum(m, tl.load(m_ptr + (rg * SPLITS + s) * REP_P + r))
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D_P], tl.float32)
        for s in range(SPLITS):
            rows = (rg * SPLITS + s) * REP_P + r
            w = tl.exp2(tl.load(m_ptr + rows) - m_safe)
            denom += w * tl.load(denom_ptr + rows)
            acc += w[:, None] * tl.load(part_ptr + rows[:, None] * D_P + d[None, :])
        out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
        row = rg // groups
        g = rg % groups
        tl.store(out_ptr + row * so_b + (g * rep + r)[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=(r[:, None] < rep) & (d[None, :] < D))


def triton_decode_attention(q: Tensor, k: Tensor, v: Tensor, key_valid: Optional[Tensor], pos: Tensor,
                            scale: float, splits: int = 0) -> Tensor:
    """The Triton kernels (CUDA tensors, or any device under TRITON_INTERPRET=1). splits 0 = `num_splits`;
    key_valid None = every slot up to the row's pos; pos [] (all rows) or [b] (one per row)."""
    b, heads, d = q.shape
    groups, length = k.size(1), k.size(2)
    rep = heads // groups
    rep_p = max(MIN_QUERY_ROWS, triton.next_power_of_2(rep))
    d_p = max(16, triton.next_power_of_2(d))
    if not splits:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        splits = num_splits(b * groups, length, sms)
    chunk = math.ceil(math.ceil(length / splits) / BLOCK_T) * BLOCK_T
    assert k.stride(3) == 1 and v.stride(3) == 1 and q.stride(2) == 1, "head dim must be contiguous"
    out = torch.empty(b, heads, d, dtype=q.dtype, device=q.device)
    part = m = denom = out  # the partials: unused when one split covers all keys
    if splits > 1:
        part = torch.empty(b * groups * splits * rep_p, d_p, dtype=torch.float32, device=q.device)
        m = torch.empty(b * groups * splits * rep_p, dtype=torch.float32, device=q.device)
        denom = torch.empty_like(m)
    _split_kernel[(b * groups, splits)](
        q, k, v, pos if key_valid is None else key_valid, pos, out, part, m, denom,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        0 if key_valid is None else key_valid.stride(0), pos.stride(0) if pos.dim() else 0, out.stride(0),
        groups, rep, chunk, scale * math.log2(math.e),
        REP_P=rep_p, D=d, D_P=d_p, BLOCK=BLOCK_T, SPLITS=splits,
        IEEE=q.dtype == torch.float32, HAS_VALID=key_valid is not None, num_warps=4, num_stages=2)
    if splits > 1:
        _merge_kernel[(b * groups,)](part, m, denom, out, groups, rep, out.stride(0), REP_P=rep_p, D=d, D_P=d_p,
                                     SPLITS=splits, num_warps=4)
    return out
