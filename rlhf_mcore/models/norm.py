"""RMSNorm for megatron's local spec that also works under sequence parallelism.

megatron's `WrappedTorchNorm` refuses sequence parallelism, and its fused alternatives need apex or
Transformer Engine (neither exists on our CPU CI nor on a cu13 / Python 3.12 GPU box). Under sequence
parallelism each TP rank normalises only its slice of the sequence, so the weight's gradient is partial:
tagging the weight `sequence_parallel` makes `finalize_model_grads` all-reduce it over TP. The module is
plain `torch.nn.RMSNorm`, so state-dict keys are unchanged.
"""
from __future__ import annotations

import torch


class RMSNorm:
    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **unused):
        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm
