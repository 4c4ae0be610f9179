"""LM-head logits in fp32: hidden [..., H] @ weight [V, H].T with fp32 accumulation AND an fp32 output.

A plain bf16 matmul accumulates in fp32 but rounds its output to bf16. For a trained model the logits are
~10-30, where one bf16 ulp is 0.0625-0.125, so two engines whose hidden states differ in the last bit
round many logits apart and the sampled token's log-prob moves by a sizeable fraction of an ulp. Every
path that turns hidden states into log-probs, entropy or samples (trainer and native rollout) calls this
one function, so neither rounds its logits.

- CUDA, bf16/fp16 inputs of one dtype: `torch.mm(a, b, out_dtype=torch.float32)` (cuBLAS writes fp32;
  torch >= 2.8). Its checks run on the host before the launch, so it is CUDA-graph capturable.
- Elsewhere (CPU has no `aten::mm.dtype` kernel; an older torch; mixed dtypes; autograd recording, as
  `mm.dtype` may have no derivative): upcast, then matmul. Products of two bf16 / fp16 values are exact
  in fp32, so this is the same maths; only the summation order may differ.
- fp32 / fp64 inputs: the plain matmul (fp64 stays fp64, so gradcheck works).

>>> h = torch.tensor([[1.0, 2.0 ** -8]], dtype=torch.bfloat16)
>>> w = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
>>> logits_fp32(h, w)  # 1 + 2^-8 is not a bf16 value (its ulp at 1 is 2^-7)
tensor([[1.0039]])
>>> torch.matmul(h, w.t()).float()  # the bf16-output matmul rounds it away
tensor([[1.]])
"""
from __future__ import annotations

import torch
from torch import Tensor

_HALF = (torch.bfloat16, torch.float16)


def logits_fp32(hidden: Tensor, weight: Tensor) -> Tensor:
    """hidden [..., H] @ weight [V, H].T -> [..., V] in fp32 (fp64 for fp64 inputs), never rounded to the
    inputs' dtype. Differentiable: under autograd it takes the upcast path."""
    if hidden.dtype not in _HALF and hidden.dtype == weight.dtype:
        return torch.matmul(hidden, weight.t())
    flat = hidden.reshape(-1, hidden.size(-1))  # [N, H]
    recording = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if flat.is_cuda and hidden.dtype == weight.dtype and not recording:
        try:
            out = torch.mm(flat, weight.t(), out_dtype=torch.float32)  # [N, V]
        except TypeError:  # torch < 2.8: no out_dtype argument
            out = flat.float() @ weight.float().t()
    else:
        acc = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
        out = flat.to(acc) @ weight.to(acc).t()
    return out.view(*hidden.shape[:-1], weight.size(0))
