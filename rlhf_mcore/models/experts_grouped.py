"""MoE experts as two grouped GEMMs without Transformer Engine or the `grouped_gemm` package: `GroupedExperts`,
megatron's `SequentialMLP` with the per-expert loop replaced by `torch._grouped_mm` (torch >= 2.8; bf16 on CUDA),
or by a pure-torch loop over the experts (`reference`, CPU and every other dtype / device).

Parameters: SequentialMLP's own, `local_experts.{i}.linear_fc1.weight` [2F, H] ([gate; up]) and
`local_experts.{i}.linear_fc2.weight` [H, F], built by SequentialMLP.__init__ and checkpointed by its
sharded_state_dict. The weight maps (models/families), the direct HF load, full_weights, dist-checkpoints,
the optimizer and DDP see exactly what they see with SequentialMLP, and both implementations load each other's
checkpoints. The cost is a copy: each forward stacks the experts' weights into [E, 2F, H] / [E, H, F] (and
the backward again: the stacks are not kept for it, so activation memory holds no weight copy), about 3 x E
x F x H x 2 bytes read and written per layer and pass. Stacked parameters would avoid the copy but change
every parameter name the converter, HF load, full-weight gather and LoRA key on.

The maths (one `_GroupedSwiGLU` autograd function for both kernels, so the CPU reference test checks the
backward the GPU runs): with `offs` the cumulative token counts of the local experts,
    h = x @ fc1_e^T  [T, 2F];  a = silu(h_gate) * h_up * p  [T, F];  y = a @ fc2_e^T  [T, H]
as megatron's MLP with per-token probabilities (`weighted_bias_swiglu_impl`); the backward recomputes `a`
from the saved `h` and gives dx, dp, dfc1_e = dh_e^T x_e, dfc2_e = dy_e^T a_e (zero for an expert with no
tokens).

`model.moe_expert_impl` (`expert_impl_for`): auto (grouped where torch._grouped_mm runs: CUDA, bf16,
SM >= 90; else megatron's SequentialMLP) | sequential | grouped | grouped-reference (ours, always the loop).
"""
from __future__ import annotations

import logging
from functools import partial

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

from rlhf_mcore.logs import log_once
from rlhf_mcore.models.lora_experts import grouped_lora_term, has_expert_lora
from rlhf_mcore.registry import Registry

log = logging.getLogger(__name__)
EXPERT_IMPLS = ("auto", "sequential", "grouped", "grouped-reference")
GROUPED_MM: Registry = Registry("grouped matmul kernel")


def _bounds(counts: list[int]) -> list[tuple[int, int]]:
    ends = [sum(counts[: i + 1]) for i in range(len(counts))]
    return [(end - n, end) for n, end in zip(counts, ends)]


@GROUPED_MM.register("reference")
def grouped_mm_reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """What torch._grouped_mm computes, one matmul per group. b [E, K, N]: a [T, K] grouped by rows -> [T, N];
    b [T, N] (2-D): a [M, T] grouped along T -> [E, M, N].

    >>> a, b = torch.arange(6.).reshape(3, 2), torch.ones(2, 2, 1)
    >>> grouped_mm_reference(a, b * torch.tensor([1., 10.]).view(2, 1, 1), None, [1, 2]).flatten().tolist()
    [1.0, 50.0, 90.0]
    >>> grouped_mm_reference(a.t(), torch.ones(3, 1), None, [0, 3]).flatten().tolist()
    [0.0, 0.0, 6.0, 9.0]
    """
    spans = _bounds(counts)
    if b.dim() == 3:
        if not spans or a.shape[0] == 0:
            return a.new_zeros(a.shape[0], b.shape[-1])
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(spans)])
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in spans])


@GROUPED_MM.register("grouped_mm")
def grouped_mm_torch(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """torch._grouped_mm (CUTLASS grouped GEMM, fp32 accumulation); no tokens at all: the reference."""
    if a.numel() == 0 or b.numel() == 0:
        return grouped_mm_reference(a, b, offs, counts)
    return torch._grouped_mm(a, b, offs=offs)


def weighted_swiglu(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up * p per token (h = [gate, up] [T, 2F], p [T]) -> [T, F] in h's dtype (megatron's
    `weighted_swiglu`: the product in the wider dtype, then cast)."""
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) * up * probs.unsqueeze(-1)).to(h.dtype)


def weighted_swiglu_backward(grad: torch.Tensor, h: torch.Tensor, probs: torch.Tensor):
    """(dL/dh [T, 2F], dL/dp [T]) of `weighted_swiglu`, computed in fp32 (megatron's `weighted_swiglu_back`)."""
    gate, up = h.float().chunk(2, dim=-1)
    g = grad.float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    scaled = g * probs.float().unsqueeze(-1)
    d_gate = scaled * up * sig * (1 + gate * (1 - sig))
    d_h = torch.cat([d_gate, scaled * silu], dim=-1).to(h.dtype)
    return d_h, (silu * up * g).sum(-1).to(probs.dtype)


def _zero_empty(grads: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Per-expert weight gradients [E, ...] with the experts no token chose set to zero (whatever the kernel
    leaves in an empty group)."""
    empty = [i for i, n in enumerate(counts) if n == 0]
    if empty:
        grads.index_fill_(0, torch.tensor(empty, device=grads.device), 0)
    return grads


class _GroupedSwiGLU(torch.autograd.Function):
    """(y, a): y = fc2_e(a), a = weighted_swiglu(fc1_e(x) + d1) per expert group. d1 [T, 2F] (or None) is added
    to the first GEMM's output (the experts' LoRA term, computed outside); `a` is returned for the second one's.
    Saves x, p and h, never the stacked weights."""

    @staticmethod
    def forward(ctx, x, probs, d1, offs, counts, mm, num, *weights):
        ctx.set_materialize_grads(False)
        fc1, fc2 = torch.stack(weights[:num]), torch.stack(weights[num:])  # [E, 2F, H], [E, H, F]
        h = mm(x, fc1.transpose(1, 2), offs, counts)  # [T, 2F]
        if d1 is not None:
            h = h + d1
        a = weighted_swiglu(h, probs)  # [T, F]
        y = mm(a, fc2.transpose(1, 2), offs, counts)  # [T, H]
        ctx.save_for_backward(x, probs, offs, h, *weights)
        ctx.counts, ctx.mm, ctx.num = counts, mm, num
        return y, a

    @staticmethod
    def backward(ctx, grad_y, grad_a_out):
        x, probs, offs, h, *weights = ctx.saved_tensors
        counts, mm, num = ctx.counts, ctx.mm, ctx.num
        want_w = any(ctx.needs_input_grad[7:])
        fc1, fc2 = torch.stack(weights[:num]), torch.stack(weights[num:])  # [E, 2F, H], [E, H, F]
        grad_a = None
        if grad_y is not None:
            grad_y = grad_y.contiguous()
            grad_a = mm(grad_y, fc2, offs, counts)  # [T, F]
        del fc2
        if grad_a_out is not None:
            grad_a = grad_a_out if grad_a is None else grad_a + grad_a_out
        if grad_a is None:
            return (None,) * (7 + 2 * num)
        grad_h, grad_p = weighted_swiglu_backward(grad_a, h, probs)  # [T, 2F], [T]
        grad_x = mm(grad_h, fc1, offs, counts) if ctx.needs_input_grad[0] else None  # [T, H]
        del fc1
        grads_w = [None] * (2 * num)
        if want_w:
            d_fc1 = _zero_empty(mm(grad_h.t(), x, offs, counts), counts)  # [E, 2F, H]
            d_fc2 = [torch.zeros_like(w) for w in weights[num:]] if grad_y is None else \
                _zero_empty(mm(grad_y.t(), weighted_swiglu(h, probs), offs, counts), counts).unbind(0)  # [E, H, F]
            grads_w = [*d_fc1.unbind(0), *d_fc2]
        grad_d1 = grad_h if ctx.needs_input_grad[2] else None
        return grad_x, grad_p, grad_d1, None, None, None, None, *grads_w


class _GroupedLinear(torch.autograd.Function):
    """y = x_e @ w_e^T per expert group, w stacked [E, N, K] (small: the LoRA factors), saved for backward."""

    @staticmethod
    def forward(ctx, x, w, offs, counts, mm):
        ctx.save_for_backward(x, w, offs)
        ctx.counts, ctx.mm = counts, mm
        return mm(x, w.transpose(1, 2), offs, counts)

    @staticmethod
    def backward(ctx, grad_y):
        x, w, offs = ctx.saved_tensors
        counts, mm = ctx.counts, ctx.mm
        grad_y = grad_y.contiguous()
        grad_x = mm(grad_y, w, offs, counts) if ctx.needs_input_grad[0] else None
        grad_w = _zero_empty(mm(grad_y.t(), x, offs, counts), counts) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None


def expert_offsets(counts: list[int], device) -> torch.Tensor:
    """The cumulative token counts (int32) torch._grouped_mm takes as `offs`."""
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device, non_blocking=True)


def grouped_swiglu(x, probs, counts: list[int], fc1: list, fc2: list, kernel: str = "reference", lora=None):
    """The experts' output [T, H] for tokens x [T, H] sorted by expert (counts[e] rows each) with routing
    probabilities p [T]; fc1 / fc2: the experts' [2F, H] / [H, F] weights. `lora(which, x, linear)`: the experts'
    LoRA term of linear_fc1 / linear_fc2 for their input ([T, out] or None; `lora_experts.grouped_lora_term`),
    given `linear(x, w)`, x_e @ w_e^T per group for a stack w [E, N, K]."""
    offs = expert_offsets(counts, x.device)
    x = x.contiguous()

    def linear(inp, w):
        return _GroupedLinear.apply(inp.contiguous(), w, offs, counts, GROUPED_MM.get(low_rank_kernel(kernel, w)))

    d1 = lora("linear_fc1", x, linear) if lora else None
    y, a = _GroupedSwiGLU.apply(x, probs, d1, offs, counts, GROUPED_MM.get(kernel), len(fc1), *fc1, *fc2)
    d2 = lora("linear_fc2", a, linear) if lora else None
    return y if d2 is None else y + d2


def low_rank_kernel(kernel: str, w: torch.Tensor) -> str:
    """The kernel for a LoRA factor stack w [E, N, K]: torch._grouped_mm needs every dimension's rows 16-byte
    aligned (a rank that is a multiple of 8 in bf16); the reference loop otherwise."""
    if kernel == "grouped_mm" and any(d * w.element_size() % 16 for d in w.shape[1:]):
        log_once(log, "lora rank align", "MoE experts: LoRA rank %s is not a multiple of 8: its grouped GEMMs "
                 "run the torch reference loop (slower)", min(w.shape[1:]))
        return "reference"
    return kernel


def kernel_for(device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """('grouped_mm' | 'reference', why) for tensors on `device` of `dtype`."""
    if not hasattr(torch, "_grouped_mm"):
        return "reference", f"torch {torch.__version__} has no _grouped_mm"
    if device.type != "cuda":
        return "reference", f"device {device.type}"
    if dtype != torch.bfloat16:
        return "reference", f"dtype {str(dtype).replace('torch.', '')} (grouped_mm is bf16)"
    return "grouped_mm", "cuda bf16"


class GroupedExperts(SequentialMLP):
    """Drop-in for SequentialMLP (same constructor, parameters and checkpoint layout) computing all local
    experts with two grouped GEMMs. `kernel`: 'grouped_mm' (where it runs, else the reference) | 'reference' |
    'sequential' (SequentialMLP's own loop; the benchmarks switch it on one model)."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, kernel: str = "grouped_mm"):
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection)
        c = self.config
        unsupported = {"fp8": c.fp8, "fp4": c.fp4, "add_bias_linear": c.add_bias_linear,
                       "gated_linear_unit=False": not c.gated_linear_unit,
                       "activation_func != silu": c.activation_func is not F.silu,
                       "activation_func_clamp_value": c.activation_func_clamp_value is not None,
                       "glu_linear_offset": bool(c.glu_linear_offset)}
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(f"model.moe_expert_impl: the grouped experts compute bias-free SwiGLU experts only "
                             f"(got {', '.join(bad)}). Set model.moe_expert_impl=sequential.")
        self.kernel = kernel

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        if self.kernel == "sequential":
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        x, probs = permuted_local_hidden_states, permuted_probs  # [T, H], [T]
        if self.config.moe_apply_probs_on_input:  # top-1 only (SequentialMLP asserts it): scale x, p = 1
            x, probs = (probs.unsqueeze(-1) * x).to(x.dtype), torch.ones_like(probs)
        kernel, why = (self.kernel, "asked") if self.kernel == "reference" else kernel_for(x.device, x.dtype)
        if kernel != self.kernel:
            log_once(log, f"fallback {why}", "MoE experts: grouped, torch reference loop (%s)", why)
        fc1 = [e.linear_fc1.weight for e in self.local_experts]
        fc2 = [e.linear_fc2.weight for e in self.local_experts]
        counts = [int(n) for n in tokens_per_expert.tolist()]
        lora = partial(grouped_lora_term, self.local_experts) if has_expert_lora(self.local_experts) else None
        return grouped_swiglu(x, probs, counts, fc1, fc2, kernel, lora), None


def expert_impl_for(name: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """model.moe_expert_impl -> ('sequential' | 'grouped' | 'grouped-reference', why)."""
    if name != "auto":
        return name, "model.moe_expert_impl"
    kernel, why = kernel_for(device, dtype)
    if kernel == "grouped_mm" and torch.cuda.get_device_capability(device) < (9, 0):
        kernel, why = "reference", "SM < 90"
    return ("grouped", f"auto: {why}") if kernel == "grouped_mm" else ("sequential", f"auto: {why}")


def use_expert_impl(layer_spec, name: str, device: torch.device, dtype: torch.dtype):
    """The MoE layer spec with its experts module chosen by model.moe_expert_impl (logged once per choice);
    a spec without SequentialMLP experts (dense, or TE's grouped MLP) is returned as it is."""
    experts = getattr(getattr(layer_spec.submodules, "mlp", None), "submodules", None)
    experts = getattr(experts, "experts", None)
    if experts is None or experts.module is not SequentialMLP:
        return layer_spec
    impl, why = expert_impl_for(name, device, dtype)
    if impl != "sequential":
        experts.module = GroupedExperts
        experts.params = {**(experts.params or {}),
                          "kernel": "reference" if impl == "grouped-reference" else "grouped_mm"}
    line = {"sequential": "megatron SequentialMLP (one GEMM pair per expert)",
            "grouped": "grouped (torch._grouped_mm where CUDA + bf16, else the torch reference loop)",
            "grouped-reference": "grouped, torch reference loop"}[impl]
    log_once(log, f"impl {impl} [{why}]", "MoE experts: %s [%s]", line, why)
    return layer_spec
