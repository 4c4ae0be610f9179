"""The static decoder's weights with LoRA adapters merged in (`models.lora`), once per rollout.

The static decode step (`rollout.static_decode`) reads raw weight tensors (`decode_layer.LayerWeights`), not
the linear modules, so it would silently skip the adapters' branch. Instead it reads, for every linear that
has adapters, a buffer holding the effective weight W + (alpha / r) B @ A (`models.lora.effective_weight`):

- a buffer is allocated the first time the decoder builds its layer weights and refreshed in place before
  every rollout (`refresh`: one B @ A per adapted linear, ~2 r in out FLOPs, nothing per token), so the
  CUDA graphs captured over it stay valid and read the current adapters;
- decode speed is the base model's (the same GEMMs over the same shapes);
- the memory is one more copy of the adapted weights while the buffers live: they go with the static cache
  and its graphs (`StaticDecoder.release`: at `release_memory` unless rollout.native.keep_graphs).

The prefill runs megatron's modules, i.e. the adapters' own forward, as the trainer does. The merged
weights round once (W + delta in the weight's dtype) where the trainer's forward adds the two branches'
outputs: in fp32 the decode step's log-probs equal the trainer's to ~1e-6; in bf16 they differ by bf16
noise (tests/unit/rollout/test_lora_decode.py; the GPU gap is in benchmarks/).
Megatron's eager decode path (TP/PP > 1, CPU engine default) runs the modules, adapters included.
"""
from __future__ import annotations

import torch

from rlhf_mcore.rollout.decode_layer import raw_weight


def adapted_linears(model) -> set[int]:
    """ids of the linears of `model` that carry LoRA adapters (empty without adapters)."""
    from rlhf_mcore.models.full_weights import merged_linears

    return {id(linear) for linear in merged_linears(model)[1].values()}


class MergedWeights:
    """linear -> its effective weight for the decode step: a merged buffer for an adapted linear, the
    parameter itself for the others."""

    def __init__(self, model):
        self.adapted = adapted_linears(model)
        self.buffers: dict[int, tuple[object, torch.Tensor]] = {}  # id(linear) -> (linear, merged weight)

    def __bool__(self) -> bool:
        return bool(self.adapted)

    @torch.no_grad()
    def weight(self, linear) -> torch.Tensor:
        """`decode_layer.layer_weights`' `weight`: the merged buffer (allocated and filled once), or raw."""
        if id(linear) not in self.adapted:
            return raw_weight(linear)
        if id(linear) not in self.buffers:
            from rlhf_mcore.models.lora import effective_weight

            self.buffers[id(linear)] = (linear, effective_weight(linear).detach().clone())
        return self.buffers[id(linear)][1]

    @torch.no_grad()
    def refresh(self) -> None:
        """Write every buffer's effective weight in place (call before each rollout: the adapters moved)."""
        from rlhf_mcore.models.lora import effective_weight

        for linear, buffer in self.buffers.values():
            buffer.copy_(effective_weight(linear))

    def release(self) -> None:
        self.buffers = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for _, b in self.buffers.values())
