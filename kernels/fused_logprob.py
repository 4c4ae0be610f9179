"""Per-token log-probs and entropy from last hidden states and the (vocab-parallel) output weight.

    logp, entropy = fused_logprob_entropy(hidden [N, H], weight [V_local, H], targets [N])

With z = hidden @ weight.T / temperature (fp32, never rounded to bf16: `kernels.logits.logits_fp32`,
the same logits as the native rollout's), lse = logsumexp(z):
    logp = z[target] - lse,   entropy = lse - sum_v softmax(z)_v z_v
Tokens are processed `chunk_size` at a time, so logits exist for one chunk only, never for the whole
batch; the backward recomputes them chunk by chunk from the saved (lse, E_p[z]) and uses
    dL/dz_v = g_logp (1[v = target] - p_v) - g_entropy p_v (z_v - E_p[z]).

Vocab parallel (`tp_group` given): rank r holds rows [vocab_start, vocab_start + V_local) of the weight
(shards may differ in size, even be empty). Each rank reduces its shard, then one MAX and one SUM
all-reduce combine (max, sum-exp, sum-exp*z, target logit) over the group. `hidden` must be the full
hidden, identical on every TP rank (not sequence-parallel shards), and must NOT already pass through
megatron's `copy_to_tensor_model_parallel_region`: this function's backward all-reduces the partial
dL/dhidden of every rank itself. dL/dweight is local to each shard. Targets on no shard (e.g. -100)
give logp = -lse: mask them downstream.

Two implementations share the chunking and the TP reductions: a pure-torch one (CPU, CI) and, for CUDA
tensors when triton is importable, Triton kernels that make the softmax statistics and dL/dz in one pass
over each chunk's fp32 logits (dL/dz written in the weight's dtype), while the matmuls stay on cuBLAS.
`reference_logprob_entropy` is the plain full-logits version that the tests compare against.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from rlhf_mcore.kernels.logits import logits_fp32
from torch import Tensor

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only installs
    HAS_TRITON = False


def _acc_dtype(t: Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs, fp64 for fp64 ones (so gradcheck works)."""
    return torch.promote_types(t.dtype, torch.float32)


def reference_logprob_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0):
    """Full logits + log_softmax in fp32 (fp64 for fp64 inputs).
    hidden [N, H], weight [V, H], targets [N] -> (logp [N], entropy [N])."""
    acc = _acc_dtype(hidden)
    logits = (hidden.to(acc) @ weight.to(acc).t()) / temperature  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, V]
    logp = logp_all.gather(-1, targets.long()[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


# ----------------------------------------------------------------------------- torch chunk maths
def _stats_torch(logits: Tensor, local_tgt: Tensor, inv_t: float) -> Tensor:
    """Per-row (max, sum exp(z - max), sum exp(z - max) z, z[target] or 0) of one chunk. [c, V] -> [4, c]"""
    z = logits.to(_acc_dtype(logits)) * inv_t  # [c, V]
    m = z.max(-1).values  # [c]
    z_t = z.gather(-1, local_tgt.clamp(min=0)[:, None]).squeeze(-1)
    z_t = torch.where(local_tgt >= 0, z_t, torch.zeros_like(z_t))
    z.sub_(m[:, None])  # d = z - m
    e = torch.exp(z)  # [c, V]
    s = e.sum(-1)
    sz = torch.bmm(e[:, None, :], z[:, :, None]).view(-1) + m * s  # sum e * (d + m), no [c, V] temporary
    return torch.stack([m, s, sz, z_t])


def _grad_logits_torch(logits: Tensor, local_tgt: Tensor, lse: Tensor, ez: Tensor, g_logp: Tensor,
                       g_ent: Tensor, inv_t: float, out_dtype: torch.dtype) -> Tensor:
    """dL/d(hidden @ weight.T) of one chunk, computed in fp32, returned in out_dtype. [c, V] -> [c, V]"""
    d = logits.to(_acc_dtype(logits)) * inv_t - ez[:, None]  # z - E_p[z]
    p = torch.exp(d - (lse - ez)[:, None])  # softmax
    dz = d.mul_(g_ent[:, None]).add_(g_logp[:, None]).mul_(p).neg_()
    rows = torch.nonzero(local_tgt >= 0).squeeze(-1)
    dz.index_put_((rows, local_tgt[rows]), g_logp[rows], accumulate=True)
    return dz.mul_(inv_t).to(out_dtype)


# ----------------------------------------------------------------------------- triton chunk maths
if HAS_TRITON:

    @triton.jit
    def _stats_kernel(logits_ptr, tgt_ptr, out_ptr, num_rows, vocab, stride, inv_t, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        lanes = tl.arange(0, BLOCK_V)
        m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), 0)
        s = tl.sum(tl.zeros([BLOCK_V], tl.float32), 0)
        sz = tl.sum(tl.zeros([BLOCK_V], tl.float32), 0)
        for start in range(0, vocab, BLOCK_V):
            offs = start + lanes
            inside = offs < vocab
            z = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, tl.max(z, 0))
            alpha = tl.exp(m - m_new)
            e = tl.exp(z - m_new)
            s = s * alpha + tl.sum(e, 0)
            sz = sz * alpha + tl.sum(tl.where(inside, e * z, 0.0), 0)
            m = m_new
        tgt = tl.load(tgt_ptr + row)
        z_t = tl.load(base + tl.maximum(tgt, 0)).to(tl.float32) * inv_t
        tl.store(out_ptr + row, m)
        tl.store(out_ptr + num_rows + row, s)
        tl.store(out_ptr + 2 * num_rows + row, sz)
        tl.store(out_ptr + 3 * num_rows + row, tl.where(tgt >= 0, z_t, 0.0))

    @triton.jit
    def _grad_kernel(logits_ptr, tgt_ptr, lse_ptr, ez_ptr, gl_ptr, ge_ptr, out_ptr, vocab, stride, out_stride,
                     inv_t, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        out = out_ptr + row * out_stride  # == base when written in place
        lanes = tl.arange(0, BLOCK_V)
        tgt = tl.load(tgt_ptr + row)
        lse = tl.load(lse_ptr + row)
        ez = tl.load(ez_ptr + row)
        g_logp = tl.load(gl_ptr + row)
        g_ent = tl.load(ge_ptr + row)
        for start in range(0, vocab, BLOCK_V):
            offs = start + lanes
            inside = offs < vocab
            z = tl.load(base + offs, mask=inside, other=0.0).to(tl.float32) * inv_t
            p = tl.exp(z - lse)
            dz = -p * (g_logp + g_ent * (z - ez))
            dz = tl.where(offs == tgt, dz + g_logp, dz) * inv_t
            tl.store(out + offs, dz.to(out_ptr.dtype.element_ty), mask=inside)


def _block_v(vocab: int) -> int:
    return min(4096, triton.next_power_of_2(max(vocab, 16)))


def _stats_triton(logits: Tensor, local_tgt: Tensor, inv_t: float) -> Tensor:
    rows, vocab = logits.shape
    out = torch.empty(4, rows, dtype=torch.float32, device=logits.device)
    _stats_kernel[(rows,)](logits, local_tgt, out, rows, vocab, logits.stride(0), inv_t,
                           BLOCK_V=_block_v(vocab), num_warps=8)
    return out


def _grad_logits_triton(logits: Tensor, local_tgt: Tensor, lse: Tensor, ez: Tensor, g_logp: Tensor,
                        g_ent: Tensor, inv_t: float, out_dtype: torch.dtype) -> Tensor:
    """dL/dlogits in out_dtype: in place when the logits have it, else one pass writing a new buffer (fp32
    logits of bf16 inputs -> bf16 dz, with no separate cast pass over the chunk)."""
    rows, vocab = logits.shape
    out = logits if logits.dtype == out_dtype else torch.empty(logits.shape, dtype=out_dtype, device=logits.device)
    _grad_kernel[(rows,)](logits, local_tgt, lse, ez, g_logp.contiguous(), g_ent.contiguous(), out, vocab,
                          logits.stride(0), out.stride(0), inv_t, BLOCK_V=_block_v(vocab), num_warps=8)
    return out


# ----------------------------------------------------------------------------- shared driver
def _local_targets(targets: Tensor, vocab_start: int, vocab_local: int) -> Tensor:
    """Global ids -> index into this shard, -1 where the target lives on another shard. [N] long"""
    local = targets.long() - vocab_start
    return torch.where((local >= 0) & (local < vocab_local), local, torch.full_like(local, -1))


def _reduce_over_tp(stats: Tensor, tp_group) -> Tensor:
    """Combine per-shard (max, sumexp, sumexp*z, z_target) [4, N] into global ones (two all-reduces)."""
    if tp_group is None:
        return stats
    local_max = stats[0]
    global_max = local_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=tp_group)
    scale = torch.exp(local_max - global_max)  # 0 for an empty shard (local max -inf)
    packed = torch.stack([stats[1] * scale, stats[2] * scale, stats[3]])
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=tp_group)
    return torch.cat([global_max[None], packed])


class _FusedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, tp_group, vocab_start, temperature, chunk_size, use_triton):
        num_tokens, vocab_local = hidden.shape[0], weight.shape[0]
        inv_t = 1.0 / temperature if temperature > 0 else 1.0  # 0: greedy samples, scored at T = 1 (rollout.sampling)
        local_tgt = _local_targets(targets, vocab_start, vocab_local)
        stats_fn = _stats_triton if use_triton else _stats_torch
        stats = torch.empty(4, num_tokens, dtype=_acc_dtype(hidden), device=hidden.device)
        stats[0].fill_(float("-inf"))  # what an empty shard contributes
        stats[1:].zero_()
        for lo in range(0, num_tokens if vocab_local else 0, chunk_size):
            hi = min(lo + chunk_size, num_tokens)
            stats[:, lo:hi] = stats_fn(logits_fp32(hidden[lo:hi], weight), local_tgt[lo:hi], inv_t)
        m, s, sz, z_t = _reduce_over_tp(stats, tp_group)
        lse, ez = m + torch.log(s), sz / s
        ctx.save_for_backward(hidden, weight, local_tgt, lse, ez)
        ctx.cfg = (tp_group, inv_t, chunk_size, use_triton)
        return z_t - lse, lse - ez

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, local_tgt, lse, ez = ctx.saved_tensors
        tp_group, inv_t, chunk_size, use_triton = ctx.cfg
        grad_fn = _grad_logits_triton if use_triton else _grad_logits_torch
        acc = lse.dtype
        g_logp, g_ent = g_logp.to(acc), g_ent.to(acc)
        num_tokens = hidden.shape[0]
        d_hidden = torch.zeros(hidden.shape, dtype=acc, device=hidden.device)
        d_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for lo in range(0, num_tokens if weight.shape[0] else 0, chunk_size):
            hi = min(lo + chunk_size, num_tokens)
            h = hidden[lo:hi]
            dz = grad_fn(logits_fp32(h, weight), local_tgt[lo:hi], lse[lo:hi], ez[lo:hi], g_logp[lo:hi],
                         g_ent[lo:hi], inv_t, weight.dtype)  # [c, V_local]
            if ctx.needs_input_grad[0]:
                d_hidden[lo:hi] = dz @ weight
            if ctx.needs_input_grad[1]:
                d_weight += dz.t() @ h
        if tp_group is not None and ctx.needs_input_grad[0]:
            dist.all_reduce(d_hidden, op=dist.ReduceOp.SUM, group=tp_group)  # hidden is replicated over TP
        return d_hidden.to(hidden.dtype), d_weight.to(weight.dtype), None, None, None, None, None, None


def fused_logprob_entropy(
    hidden: Tensor,  # [N, H]
    weight: Tensor,  # [V_local, H]
    targets: Tensor,  # [N] global vocab ids
    *,
    tp_group=None,
    vocab_start: int = 0,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """(logp [N], entropy [N]) in fp32 (fp64 for fp64 inputs), differentiable w.r.t. hidden and weight.

    backend: "torch", "triton", or None = triton for CUDA tensors when it is importable, else torch.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"fused_logprob_entropy: need hidden [N, H] and weight [V, H] "
                         f"(got {tuple(hidden.shape)} and {tuple(weight.shape)}). Flatten tokens first.")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"fused_logprob_entropy: targets must be [N={hidden.shape[0]}] (got {tuple(targets.shape)})."
        )
    if backend is None:
        backend = "triton" if HAS_TRITON and hidden.is_cuda and hidden.dtype != torch.float64 else "torch"
    if backend not in ("torch", "triton") or (backend == "triton" and not (HAS_TRITON and hidden.is_cuda)):
        raise ValueError(f"fused_logprob_entropy: backend {backend!r} is not available here. Use 'torch'.")
    return _FusedLogprobEntropy.apply(hidden.contiguous(), weight.contiguous(), targets, tp_group, vocab_start,
                                      float(temperature), int(chunk_size), backend == "triton")
