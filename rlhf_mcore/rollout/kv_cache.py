"""The KV cache of the native engine: megatron's `StaticInferenceContext` plus our attention masks.

Passed as `inference_context=` to `GPTModel.forward` (in eval mode), each attention layer allocates its
[max_seq, max_batch, groups/tp, head_dim] K and V buffers on first use, writes the new keys/values at
`sequence_len_offset` and attends over `[:offset + s]`; RoPE is applied after the cache read at absolute
slot positions, so left padding plus a padding mask gives exact results. The caller advances the offset.
Megatron only needs `torch.cuda.current_device()` here, which `rlhf_mcore.cpu_compat` maps to the CPU.

Why megatron's context and not a cache of our own: it runs unchanged on CPU and GPU with our SDPA core
attention, keeps the model code untouched (no forward hooks, no GPTModel subclass) and works per PP stage.
Its cost: keys are cached before RoPE, so every decode step re-rotates all cached keys of every layer
(an elementwise pass over K; small next to the weights with GQA, noticeable at long sequences and large
batches). Megatron's rotated-key path (`flash_decode`) needs flash-attn and ignores our padding mask.

Masks follow megatron's convention (bool, True = masked out), broadcast as [B, 1, sq, sk] by SDPAttention.
"""
from __future__ import annotations

from typing import Optional

import torch


def new_context(max_batch_size: int, max_sequence_length: int):
    """An empty static context; K/V buffers appear on the first forward that uses it."""
    from megatron.core.inference.contexts import StaticInferenceContext

    return StaticInferenceContext(max_batch_size, max_sequence_length)


def fits(context, batch_size: int, sequence_length: int) -> bool:
    """Can `context` hold `batch_size` rows of `sequence_length` slots (its buffers are reused)?"""
    return (context is not None and context.max_batch_size >= batch_size
            and context.max_sequence_length >= sequence_length)


def compact(context, keep: torch.Tensor) -> None:
    """Move the cached rows `keep` ([n] long, in their new order) to the front of every K/V buffer, so a
    decode step over n rows reads slots [:, :n]; buffers keep their size (no reallocation)."""
    length, n = context.sequence_len_offset, keep.numel()
    for key, value in context.key_value_memory_dict.values():
        key[:length, :n] = key[:length, keep]
        value[:length, :n] = value[:length, keep]


def prefill_mask(valid: torch.Tensor) -> Optional[torch.Tensor]:
    """valid [B, S] bool (False on left padding) -> [B, 1, S, S] bool, True = masked; None when no row is
    padded (plain causal). A padding query attends to itself only, so no softmax row is empty (NaN-free).

    >>> prefill_mask(torch.tensor([[False, True, True]]))[0, 0].int().tolist()
    [[0, 1, 1], [1, 0, 1], [1, 0, 0]]
    """
    if bool(valid.all()):
        return None
    s = valid.size(1)
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(s, dtype=torch.bool, device=valid.device)
    allowed = causal & (valid[:, None, :] | eye)  # [B, S, S]
    return ~allowed.unsqueeze(1)


def decode_mask(valid: torch.Tensor, length: int) -> Optional[torch.Tensor]:
    """valid [B, >= length] bool -> [B, 1, 1, length] for one new token attending to slots [:length];
    None when no row has padding (then every cached slot may be attended).

    >>> decode_mask(torch.tensor([[False, True, True, True]]), 3).int().tolist()
    [[[[1, 0, 0]]]]
    """
    if valid is None:
        return None
    return ~valid[:, None, None, :length]


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> (tokens [B, P] long left-padded with pad_id, valid [B, P] bool).

    >>> tokens, valid = left_pad([[5, 6], [7]], 0, "cpu")
    >>> tokens.tolist(), valid.tolist()
    ([[5, 6], [0, 7]], [[True, True], [False, True]])
    """
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        if p:
            tokens[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, width - len(p):] = True
    return tokens.to(device), valid.to(device)


def right_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> (tokens [B, P] long from column 0, right-padded with pad_id; lengths [B] long): the
    trainer's layout (`responses.assemble_batch`), used by the static decoder.

    >>> tokens, lengths = right_pad([[5, 6], [7]], 0, "cpu")
    >>> tokens.tolist(), lengths.tolist()
    ([[5, 6], [7, 0]], [2, 1])
    """
    width = max(len(p) for p in prompts)
    tokens = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts], dtype=torch.long)
    return tokens.to(device), torch.tensor([len(p) for p in prompts], dtype=torch.long).to(device)
