"""Output heads that replace `GPTModel.output_layer` after construction (we choose modules, we never
subclass GPTModel).

- `HiddenStatesHead` (actor, reference): returns the final hidden states and keeps the vocab-parallel
  output weight under the same parameter and checkpoint keys. Log-probs and entropy are then computed in
  chunks from hidden states and that weight (`rlhf_mcore.models.logprobs`), never as full-vocab logits.
- `ScalarHead` (critic value per token, reward-model score): a [num_outputs, hidden] projection,
  replicated across TP, initialised from a fixed seed so every layout starts from the same weights.

Under sequence parallelism both gather the sequence shards first. Every TP rank then computes the same
loss from the same full hidden states, so the gradient arriving at the gather is already complete on each
rank: its backward must split it (tensor_parallel_output_grad=False), not reduce-scatter (which would add
TP identical copies).
"""
from __future__ import annotations

import torch

HEAD_INIT_SEED = 20240917


def gather_sequence(hidden, tp_group):  # [s/tp, b, h] -> [s, b, h]; megatron is loaded once a model exists
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False, group=tp_group)


class HiddenStatesHead(torch.nn.Module):
    def __init__(self, linear, tp_group):
        super().__init__()
        object.__setattr__(self, "_linear", linear)  # not a child: keeps `output_layer.weight` as the key
        self.weight = linear.weight  # None when tied to the embedding on the first stage
        self.sequence_parallel = linear.sequence_parallel
        self.tp_group = tp_group

    def forward(self, hidden, weight=None, runtime_gather_output=None):  # hidden [s, b, h]
        if self.sequence_parallel:
            hidden = gather_sequence(hidden, self.tp_group)
        return hidden, None

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return self._linear.sharded_state_dict(prefix, sharded_offsets, metadata)

    def get_extra_state(self):
        return None

    def set_extra_state(self, state):
        pass


class ScalarHead(torch.nn.Module):
    def __init__(self, hidden_size: int, num_outputs: int, std: float, dtype, sequence_parallel: bool, tp_group):
        super().__init__()
        gen = torch.Generator().manual_seed(HEAD_INIT_SEED)
        init = torch.randn(num_outputs, hidden_size, generator=gen, dtype=torch.float32) * std
        self.weight = torch.nn.Parameter(init.to(dtype))
        self.sequence_parallel = sequence_parallel
        self.tp_group = tp_group

    def forward(self, hidden, weight=None, runtime_gather_output=None):  # hidden [s, b, h] -> [s, b, n]
        if self.sequence_parallel:
            hidden = gather_sequence(hidden, self.tp_group)
        return torch.matmul(hidden, self.weight.t()), None

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(state, prefix, {}, sharded_offsets)


def lm_output_weight(model) -> torch.Tensor:
    """The vocab-parallel output weight [V/tp, h] used by log-prob and sampling code (last stage)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight
