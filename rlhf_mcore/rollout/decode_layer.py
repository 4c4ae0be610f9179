"""One transformer layer of a 1-token decode step as pure tensor functions over the actor's own parameters
(tp = pp = 1), so the static decoder can run it with few kernels and `torch.compile` can fuse it.

megatron's modules launch ~35 kernels per layer for one token (its RoPE alone recomputes cos / sin from the
angles and concatenates halves for q and for k); here the same arithmetic, op for op in the same order and
dtype, reads a cos / sin table built once per cache. Eagerly the results equal megatron's bitwise (CPU tests);
compiled, the elementwise work around the four GEMMs fuses into a handful of kernels.

The layer is split at the KV cache: `attention_in` (norm, QKV projection, RoPE) and `attention_out_mlp`
(output projection, residual, norm, gated MLP, residual) are pure; the cache write and the attention run
between them, eagerly, so a compiled region never mutates its inputs.

What the static decoder compiles are the pieces between the norms: `qkv_rope`, `attention_out`, `mlp_out`,
elementwise work around a GEMM that inductor (with `emulate_precision_casts`) rounds as eager does. The
norms stay eager kernels (a compiled reduction sums in another order) and the gated activation is the trainer's
own function (`mlp_activation`: megatron's fused SwiGLU kernel when `bias_activation_fusion` is on, which rounds
once; else `config.activation_func`, SwiGLU or GeGLU), so that the rollout computes what the trainer computes.
Linear biases (Qwen2's q/k/v; Llama's attention_bias + mlp_bias: every linear) are added where megatron adds
them: q/k/v inside the projection, fc1's in the activation, the output and down projections' before the residual.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from rlhf_mcore.kernels import decode_attention as kernel
from rlhf_mcore.registry import Registry


class LayerWeights(NamedTuple):
    """Views of one layer's parameters (megatron names in comments)."""

    norm1: torch.Tensor  # input_layernorm.weight [h]
    qkv: torch.Tensor  # self_attention.linear_qkv.weight [G * (rep + 2) * D, h]
    qkv_bias: Optional[torch.Tensor]  # self_attention.linear_qkv.bias (Qwen2) or None
    proj: torch.Tensor  # self_attention.linear_proj.weight [h, H * D]
    norm2: torch.Tensor  # pre_mlp_layernorm.weight [h]
    fc1: torch.Tensor  # mlp.linear_fc1.weight [2 * ffn, h] (gate rows first, then up)
    fc2: torch.Tensor  # mlp.linear_fc2.weight [h, ffn]
    q_norm: Optional[torch.Tensor] = None  # self_attention.q_layernorm.weight [D] (Qwen3) or None
    k_norm: Optional[torch.Tensor] = None  # self_attention.k_layernorm.weight [D] (Qwen3) or None
    proj_bias: Optional[torch.Tensor] = None  # self_attention.linear_proj.bias [h] (add_bias_linear) or None
    fc1_bias: Optional[torch.Tensor] = None  # mlp.linear_fc1.bias [2 * ffn] or None
    fc2_bias: Optional[torch.Tensor] = None  # mlp.linear_fc2.bias [h] or None


def raw_weight(linear) -> torch.Tensor:
    return linear.weight


def layer_weights(layer, weight: Callable = raw_weight) -> LayerWeights:
    """The layer's tensors; `weight(linear)` gives each linear's (the static decoder passes the LoRA-merged
    ones, `rollout.merged_weights`)."""
    attention = layer.self_attention
    q_norm, k_norm = (getattr(getattr(attention, n, None), "weight", None) for n in ("q_layernorm", "k_layernorm"))
    mlp = layer.mlp
    return LayerWeights(layer.input_layernorm.weight, weight(attention.linear_qkv), attention.linear_qkv.bias,
                        weight(attention.linear_proj), layer.pre_mlp_layernorm.weight, weight(mlp.linear_fc1),
                        weight(mlp.linear_fc2), q_norm, k_norm, attention.linear_proj.bias, mlp.linear_fc1.bias,
                        mlp.linear_fc2.bias)


def functional_blockers(model) -> list[str]:
    """Model features the functional layer does not implement ([] = it computes what megatron's layer does)."""
    c = model.config
    checks = {
        "position_embedding_type is not rope or mrope": getattr(model, "position_embedding_type", "rope") not in (
            "rope", "mrope"),  # mrope: a generated token's angles are its RoPE position's (`static_decode.rope_table`)
        "rotary_interleaved": c.rotary_interleaved,
        "rotary_percent < 1": getattr(model, "rotary_percent", 1.0) != 1.0,
        "multi_latent_attention": c.multi_latent_attention,
        "MLP is not gated": not c.gated_linear_unit,
        "fused activation other than SwiGLU": fused_activation(c) and c.activation_func is not F.silu,
        "glu_linear_offset / activation clamp": c.glu_linear_offset != 0.0 or c.activation_func_clamp_value is not None,
        "fp32_residual_connection": c.fp32_residual_connection,
        "normalization is not RMSNorm": c.normalization != "RMSNorm",
    }
    return [name for name, blocked in checks.items() if blocked]


def rope_tables(freqs: torch.Tensor, dtype: torch.dtype, mscale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """megatron's per-call cos / sin of rotary angles freqs [T, 1, 1, D], once: (cos, signed sin) in dtype, each
    times `mscale` in fp32 first (YaRN's attention factor, `models.rope.attention_scaling`; x 1.0 is exact).
    The signed sin is [-sin(first half), sin(second half)], so rotate-half needs a swap and no negation.

    >>> cos, sin = rope_tables(torch.tensor([0.0, 1.0, 0.0, 1.0]).view(1, 1, 1, 4), torch.float32)
    >>> [round(x, 4) for x in sin.flatten().tolist()]
    [-0.0, -0.8415, 0.0, 0.8415]
    """
    cos, sin = (torch.cos(freqs) * mscale).to(dtype), (torch.sin(freqs) * mscale).to(dtype)
    half = freqs.size(-1) // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """megatron's `_apply_rotary_pos_emb_bshd` (not interleaved, full rotary dim) from tables:
    t * cos + rotate_half(t) * sin, with rotate_half(t) * sin == swap_halves(t) * signed sin exactly
    ((-x) * s == x * (-s) in IEEE arithmetic). t [s, b, heads, D]; cos / sin_signed [s, 1, 1, D]."""
    x1, x2 = torch.chunk(t, 2, dim=-1)
    return (t * cos) + (torch.cat((x2, x1), dim=-1) * sin_signed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: Optional[float]) -> torch.Tensor:
    """torch.nn.RMSNorm's forward (our layer spec's norm)."""
    return F.rms_norm(x, (x.size(-1),), weight, eps)


def qkv_split(normed: torch.Tensor, w: LayerWeights, groups: int, head_dim: int):
    """normed [s, b, h] (the input norm's output) -> q [s, b, H, D], k [s, b, G, D], v [s, b, G, D] before RoPE:
    megatron's `linear_qkv` (matmul, then + bias) and `get_query_key_value_tensors` split (group-major: each
    group's rep query heads, then its key, then its value)."""
    s, b = normed.shape[:2]
    mixed = torch.matmul(normed, w.qkv.t())
    if w.qkv_bias is not None:
        mixed = mixed + w.qkv_bias
    mixed = mixed.view(s, b, groups, -1)  # [s, b, G, (rep + 2) * D]
    q, k, v = torch.split(mixed, [mixed.size(-1) - 2 * head_dim, head_dim, head_dim], dim=3)
    return q.reshape(s, b, -1, head_dim), k, v


def qkv_rope(normed: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin_signed: torch.Tensor, groups: int,
             head_dim: int):
    """`qkv_split`, then RoPE on q and k -> rotated q [s, b, H, D], rotated k [s, b, G, D], v [s, b, G, D]."""
    q, k, v = qkv_split(normed, w, groups, head_dim)
    return apply_rope(q, cos, sin_signed), apply_rope(k, cos, sin_signed), v


def attention_in(hidden: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin_signed: torch.Tensor,
                 groups: int, head_dim: int, eps: Optional[float], qkv: Callable = qkv_rope):
    """hidden [s, b, h] -> (q, k, v) of `qkv_rope` after megatron's input norm (the norm eager; `qkv`: the
    static decoder passes its compiled `qkv_rope`). With q/k norms (Qwen3) megatron's per-head RMSNorm runs
    between the split and RoPE, eagerly like every norm, so that piece is not compiled."""
    normed = rms_norm(hidden, w.norm1, eps)
    if w.q_norm is None:
        return qkv(normed, w, cos, sin_signed, groups, head_dim)
    q, k, v = qkv_split(normed, w, groups, head_dim)
    q, k = rms_norm(q, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
    return apply_rope(q, cos, sin_signed), apply_rope(k, cos, sin_signed), v


def add_bias(y: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return y if bias is None else y + bias


def attention_out(attn: torch.Tensor, residual: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """attn [s, b, H * D] (core attention output), residual [s, b, h] -> residual + (`linear_proj`(attn) + bias):
    megatron's bias-dropout-add in eval."""
    return residual + add_bias(torch.matmul(attn, w.proj.t()), w.proj_bias)


def mlp_in(normed: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """normed [s, b, h] (the pre-MLP norm's output) -> `linear_fc1` [s, b, 2 * ffn] (gate, then up), before its
    bias (megatron's fc1 skips the bias add: the activation takes it)."""
    return torch.matmul(normed, w.fc1.t())


def mlp_out(act: torch.Tensor, hidden: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """act [s, b, ffn] (the gated activation's output), hidden [s, b, h] -> hidden + (`linear_fc2`(act) + bias)."""
    return hidden + add_bias(torch.matmul(act, w.fc2.t()), w.fc2_bias)


def glu(y: torch.Tensor, act: Callable = F.silu) -> torch.Tensor:
    """megatron's unfused gated MLP activation (`mlp.py`'s glu): act(gate) * up, each op rounded to y's dtype."""
    gate, up = torch.chunk(y, 2, dim=-1)
    return act(gate) * up


def glu_silu(y: torch.Tensor) -> torch.Tensor:
    """`glu` with silu (SwiGLU): the piece the static decoder compiles."""
    return glu(y)


def unfused_activation(glu_fn: Callable, y: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """megatron's unfused MLP activation: fc1's bias added, then the gated activation `glu_fn`."""
    return glu_fn(add_bias(y, bias))


unfused_swiglu = functools.partial(unfused_activation, glu_silu)


def fused_swiglu(y: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """megatron's fused SwiGLU (`bias_activation_fusion`): without a bias `fused_bias_swiglu.swiglu` on the
    [tokens, 2 * ffn] view `bias_swiglu_impl` passes it, a torch.compile'd kernel that rounds silu(gate) * up once;
    with one, `bias_swiglu_impl` itself (the bias added inside the kernel)."""
    from megatron.core.fusions import fused_bias_swiglu

    if bias is not None:
        return fused_bias_swiglu.bias_swiglu_impl(y, bias)
    return fused_bias_swiglu.swiglu(y.view(-1, y.size(-1))).view(*y.shape[:-1], -1)


def fused_activation(config) -> bool:
    return bool(config.bias_activation_fusion) and not getattr(config, "use_te_activation_func", False)


def mlp_activation(config, swiglu: Callable = glu_silu) -> Callable:
    """The activation megatron's MLP runs for this config (the trainer's forward), as f(fc1 output, fc1 bias):
    the fused SwiGLU kernel, or the unfused glu of `config.activation_func` (`swiglu`: the static decoder's
    compiled SwiGLU piece)."""
    if fused_activation(config):
        return fused_swiglu
    act = config.activation_func
    return functools.partial(unfused_activation, swiglu if act is F.silu else functools.partial(glu, act=act))


def attention_out_mlp(attn: torch.Tensor, residual: torch.Tensor, w: LayerWeights, eps: Optional[float],
                      activation: Callable = unfused_swiglu, out: Callable = attention_out,
                      mlp: Callable = mlp_out) -> torch.Tensor:
    """attn [s, b, H * D] (core attention output), residual [s, b, h] -> the layer's output [s, b, h]:
    `linear_proj`, residual add, pre-MLP norm, gated MLP (`activation(fc1 output, fc1 bias)`, see
    `mlp_activation`), residual add. The norm runs eagerly; `out` / `mlp`: the static decoder passes its compiled
    `attention_out` / `mlp_out`."""
    hidden = out(attn, residual, w)
    return mlp(activation(mlp_in(rms_norm(hidden, w.norm2, eps), w), w.fc1_bias), hidden, w)


class DecodeAttention(NamedTuple):
    """One way to attend a decode step's queries to the cache: `mask` runs once per step, `attend` per layer.
    mask(pos [b] long, length T, dtype, window) -> what attend takes, where row i's new token sits at cache slot
    pos[i] and attends to slots <= pos[i] (its prompt from slot 0, then its response: the trainer's columns), and
    only to slots > pos[i] - window for a sliding-window layer (window None: no such bound);
    attend(q [1, b, H, D], k [b, G, T, D], v [b, G, T, D], mask, scale) -> [1, b, H * D];
    reads_to_pos: attend reads each row's slots up to its pos only. Else it reads all T slots it is given, and
    the static decoder gives it the cache cut to a length bucket (`static_decode.LENGTH_BLOCK`)."""

    mask: Callable
    attend: Callable
    reads_to_pos: bool


DECODE_ATTENTION: Registry[DecodeAttention] = Registry("decode attention")


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One query per row over the cache. q [1, b, H, D], k/v [b, G, T, D], bias [b, 1, 1, T] additive
    (0 = may attend, -inf = masked) -> [1, b, H * D]. Head h uses key group h // (H / G) (megatron's
    group-major head order): the rep = H / G query heads of a group are passed to SDPA as rep query
    positions against that group's keys, so one fused kernel reads each cached key once. torch 2.11 runs
    this on cuDNN's flash kernel (with a bool mask too): ~63 us per layer at b 512, T 384 on an H200, about
    2.5x the time to read the layer's cache once (benchmarks/2026-12-01-rollout)."""
    _, b, heads, d = q.shape
    groups = k.size(1)
    qg = q[0].reshape(b, groups, heads // groups, d)  # [b, G, rep, D]
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias, scale=scale)
    return out.reshape(1, b, heads * d)


def window_slots(pos: torch.Tensor, length: int, window: Optional[int]) -> Optional[torch.Tensor]:
    """[b, T] bool: the slots a sliding window of `window` lets row i's query at slot pos[i] see (> pos[i] -
    window; the causal bound is the attention's own), None without a window.

    >>> window_slots(torch.tensor([1, 3]), 4, 2).int().tolist()
    [[1, 1, 1, 1], [0, 0, 1, 1]]
    """
    return None if window is None else torch.arange(length, device=pos.device) > pos[:, None] - window


def step_bias(pos: torch.Tensor, length: int, dtype: torch.dtype, window: Optional[int] = None) -> torch.Tensor:
    """The additive mask of a step whose row i writes cache slot pos[i]: slots <= pos[i] (and within the
    window). -> [b, 1, 1, T]

    >>> step_bias(torch.tensor([0, 2]), 3, torch.float32)[:, 0, 0].tolist()
    [[0.0, -inf, -inf], [0.0, 0.0, 0.0]]
    >>> step_bias(torch.tensor([2]), 3, torch.float32, window=2)[:, 0, 0].tolist()
    [[-inf, 0.0, 0.0]]
    """
    allowed = torch.arange(length, device=pos.device) <= pos[:, None]
    if window is not None:
        allowed = allowed & window_slots(pos, length, window)
    return attention_bias(allowed, dtype)


def kernel_mask(pos: torch.Tensor, length: int, dtype: torch.dtype, window: Optional[int] = None) -> tuple:
    """The kernel reads each row's position on the device and stops there; a window is its key_valid [b, T]."""
    return pos, window_slots(pos, length, window)


def kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: tuple, scale: float) -> torch.Tensor:
    """`kernels.decode_attention` (split-KV, stops at each row's pos) on the layout `decode_attention` takes."""
    pos, key_valid = mask
    return kernel.triton_decode_attention(q[0], k, v, key_valid, pos, scale).view(1, q.size(1), -1)


DECODE_ATTENTION.register("sdpa")(DecodeAttention(step_bias, decode_attention, reads_to_pos=False))
DECODE_ATTENTION.register("triton")(DecodeAttention(kernel_mask, kernel_attention, reads_to_pos=True))


def pick_decode_attention(name: str, device: torch.device,
                          sdpa_exact: Optional[Callable[[], bool]] = None) -> tuple[str, str]:
    """rollout.native.decode_attention -> (the entry to use, why). auto = sdpa where it computes the trainer's
    attention bitwise (`sdpa_exact()`, a probe on this device: cuDNN's flash kernel on an H200 with torch 2.11),
    else triton where it can run (a CUDA device and triton importable: faster, sums in its own order), else
    sdpa; an explicit triton without them falls back to sdpa.

    >>> pick_decode_attention("auto", torch.device("cpu"))
    ('sdpa', 'no CUDA device')
    """
    if name == "sdpa":
        return "sdpa", "rollout.native.decode_attention=sdpa"
    missing = "no CUDA device" if device.type != "cuda" else "" if kernel.HAS_TRITON else "triton not importable"
    if missing:
        return "sdpa", missing
    if name == "auto" and sdpa_exact is not None and sdpa_exact():
        return "sdpa", "it computes the trainer's attention bitwise on this GPU (probe); decode_attention=triton " \
                       "is faster and sums in its own order"
    why = "" if name == "triton" else ", as sdpa does not compute the trainer's attention bitwise here (probe)"
    return "triton", f"split-KV kernel, kernels/decode_attention.py{why}"


def sdpa_is_trainer_exact(core_attention, heads: int, groups: int, head_dim: int, dtype: torch.dtype, device,
                          scale: float) -> bool:
    """Whether the SDPA decode attention gives, bitwise, what the trainer's causal forward through
    `core_attention` (the model's own module) gives at the same positions: a random probe of 8 rows x 300
    tokens in a 384-slot cache, on this device and dtype. Both are SDPA calls, but torch picks a kernel per
    call (flash, cuDNN, memory-efficient), and only the same kernel sums in the same order."""
    g = torch.Generator().manual_seed(0)
    b, s, length = 8, 300, 384
    q = torch.randn(s, b, heads, head_dim, generator=g).to(device, dtype)
    k, v = (torch.randn(s, b, groups, head_dim, generator=g).to(device, dtype) for _ in range(2))
    with torch.no_grad():
        full = core_attention(q, k, v, None).view(s, b, heads, head_dim)  # the trainer's call, causal
        cache_k, cache_v = (torch.zeros(b, groups, length, head_dim, dtype=dtype, device=device) for _ in range(2))
        cache_k[:, :, :s], cache_v[:, :, :s] = k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)
        pos = torch.randint(0, s, (b,), generator=g).to(device)
        rows = torch.arange(b, device=device)
        got = decode_attention(q[pos, rows][None], cache_k, cache_v, step_bias(pos, length, dtype), scale)
    return torch.equal(got.view(b, heads, head_dim), full[pos, rows])


def attention_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """allowed [b, T] bool -> [b, 1, 1, T] additive mask in dtype, built once per step for every layer
    (what SDPA would build from a bool mask in each layer).

    >>> attention_bias(torch.tensor([[True, False]]), torch.float32).flatten().tolist()
    [0.0, -inf]
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))
    return bias[:, None, None, :]
