"""Core attention through `torch.nn.functional.scaled_dot_product_attention` for megatron's local spec,
plus packed sequences (rlhf_mcore.models.packed: several sequences back to back, attention within each).

The stock local `DotProductAttention` materialises the [b, np, sq, sk] score matrix in fp32 and a
softmax copy of it (133 GiB peak at 1.2B params, seq 2048, micro-batch 8 on an H200). SDPA dispatches
to flash / memory-efficient kernels on GPU and to a fused math path on CPU. It has no parameters, so
state-dict names are those of the stock local spec and checkpoints move freely between the two.

`model.sdpa_kernel` puts one SDPA kernel first on CUDA (the others stay as fallbacks, e.g. for masks flash
does not take): `auto` keeps torch's order, which picks cuDNN on Hopper; cuDNN builds an execution plan per new
(batch, length) shape, ~0.7 ms of host time per layer call when token-budget micro-batches vary in shape.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.utils import is_layer_window_attention
from megatron.core.utils import divide
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlhf_mcore.models.packed import packed_attention
from rlhf_mcore.models.spec import active_window


def bottom_right_causal_mask(sq: int, sk: int, device, window: Optional[int] = None) -> torch.Tensor:
    """[sq, sk] bool, True = may attend. Query i sits at absolute position sk - sq + i (KV-cache decode); with a
    sliding `window`, only the keys j with i - window < j <= i (transformers' `sliding_window_overlay`).

    >>> bottom_right_causal_mask(1, 3, "cpu").tolist()
    [[True, True, True]]
    >>> bottom_right_causal_mask(3, 3, "cpu", window=2).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    rows = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    cols = torch.arange(sk, device=device).unsqueeze(0)
    allowed = cols <= rows
    return allowed if window is None else allowed & (cols > rows - window)


def layer_window(config, layer_number: int) -> Optional[int]:
    """The sliding window W of layer `layer_number` (1-based, global: megatron's), None for full attention:
    megatron's `window_size` (W - 1, 0) where `window_attn_skip_freq` says the layer slides
    (`models.transformer_config.window_fields`)."""
    if not is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
        return None
    left, right = config.window_size
    if left < 0 or right != 0:
        raise ValueError(f"SDPAttention: window_size {config.window_size} is not a causal sliding window (W - 1, 0)")
    return left + 1


SDPA_KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # model.sdpa_kernel


def kernel_order(name: str) -> list | None:
    """The SDPA backends in priority order with `name` first (None for auto: torch's own order).

    >>> [b.name for b in kernel_order("flash")]
    ['FLASH_ATTENTION', 'CUDNN_ATTENTION', 'EFFICIENT_ATTENTION', 'MATH']
    """
    if name == "auto":
        return None
    first = SDPA_KERNELS[name]
    return [first, *(b for b in SDPA_KERNELS.values() if b != first)]


class SDPAttention(MegatronModule):
    """Drop-in for megatron's `DotProductAttention` (same constructor and forward signature)."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
        sdpa_kernel: str = "auto",
    ):
        super().__init__(config=config)
        self.kernels = kernel_order(sdpa_kernel)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism; set parallel.cp=1.")
        tp_size = pg_collection.tp.size() if pg_collection is not None else 1
        self.attn_mask_type = attn_mask_type
        self.num_heads = divide(config.num_attention_heads, tp_size)
        self.num_groups = divide(config.num_query_groups, tp_size)
        head_dim = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.window = layer_window(config, layer_number)  # None: full causal attention

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """query [sq, b, np, hn], key/value [sk, b, ng, hn]; attention_mask: None (causal) or
        bool broadcastable to [b, np, sq, sk] with True = masked out (megatron's convention).
        With packed_seq_params (b = 1, sequences back to back): causal attention within each sequence.
        A sliding-window layer (`self.window`) also masks the keys a window or more behind each query."""
        if attention_bias is not None:
            raise NotImplementedError("SDPAttention: attention bias is not supported")
        if packed_seq_params is not None:
            window = active_window(self.window, int(packed_seq_params.max_seqlen_q))
            out = packed_attention(query[:, 0], key[:, 0], value[:, 0], packed_seq_params, self.softmax_scale, window)
            return out.reshape(query.size(0), 1, -1)  # [T, 1, np * hn]
        sq, b, sk = query.size(0), query.size(1), key.size(0)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        window = active_window(self.window, sk)
        if attention_mask is not None:
            allowed = ~attention_mask.bool()
            if window is not None:
                allowed = allowed & bottom_right_causal_mask(sq, sk, q.device, window)
        elif sq == sk and window is None:
            allowed = None
        else:
            allowed = bottom_right_causal_mask(sq, sk, q.device, window)
        kernels = sdpa_kernel(self.kernels, set_priority=True) if self.kernels and q.is_cuda else nullcontext()
        with kernels:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, is_causal=allowed is None and attention_mask is None,
                dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
                enable_gqa=self.num_heads != self.num_groups,
            )
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)  # [sq, b, np * hn]
