"""How the actor's weights reach an embedded SGLang engine after each update: HF-named tensors grouped in
buckets of rollout.sglang.weight_bucket_mb, each bucket flattened into one byte tensor before it is handed
over (SGLang's `load_format="flattened_bucket"`).

Why flatten: `update_weights_from_tensor` passes CUDA tensors to the scheduler process by CUDA IPC, one
memory handle (and one event) per tensor, opened again on the other side. A Qwen2.5-0.5B refresh is ~290
tensors; flattened it is one handle per bucket (2 at 512 MiB), and the scheduler loads views of the bytes.
The copy into the flat tensor is one bucket's bytes on the GPU (~0.25 ms per 1 GiB at 4 TB/s).
"""
from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

import torch

FLATTENED = "flattened_bucket"  # SGLang's load_format for one flat tensor + metadata
ALIGN = 16  # every tensor starts at a multiple of 16 bytes: any dtype's view is legal, copies vectorise


class FlatEntry(NamedTuple):
    """Where one tensor lies in a flat bucket: bytes [start, end) hold it as `dtype`, reshaped to `shape`."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start: int
    end: int


def weight_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of (name, tensor) of at most bucket_bytes each (a larger tensor goes alone),
    drawn lazily from `named`.

    >>> [[n for n, _ in b] for b in weight_buckets([("a", torch.zeros(4)), ("b", torch.zeros(4)),
    ...                                              ("c", torch.zeros(9))], 32)]
    [['a', 'b'], ['c']]
    """
    bucket, size = [], 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def flatten_bucket(bucket: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[FlatEntry]]:
    """(name, tensor) pairs of any dtypes and strides -> (flat [bytes] uint8 on their device, entries); each
    tensor starts at a multiple of ALIGN bytes (the gaps are never read).

    >>> flat, entries = flatten_bucket([("a", torch.zeros(3, dtype=torch.bfloat16)), ("b", torch.ones(2, 2))])
    >>> flat.numel(), [(e.name, e.start, e.end) for e in entries]
    (32, [('a', 0, 6), ('b', 16, 32)])
    """
    entries, start = [], 0
    for name, tensor in bucket:
        start = -(-start // ALIGN) * ALIGN
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(FlatEntry(name, tensor.shape, tensor.dtype, start, start + nbytes))
        start += nbytes
    flat = torch.empty(start, dtype=torch.uint8, device=bucket[0][1].device)
    for (_, tensor), entry in zip(bucket, entries):
        flat[entry.start:entry.end].view(entry.dtype).view(entry.shape).copy_(tensor)  # any strides in
    return flat, entries


def unflatten_bucket(flat: torch.Tensor, entries: list[FlatEntry]) -> list[tuple[str, torch.Tensor]]:
    """The inverse of flatten_bucket: views of `flat` (what SGLang's loader reads).

    >>> pairs = [("a", torch.ones(3, dtype=torch.bfloat16)), ("b", torch.arange(4.).view(2, 2).t())]
    >>> all(torch.equal(t, u) for (_, t), (_, u) in zip(pairs, unflatten_bucket(*flatten_bucket(pairs))))
    True
    """
    return [(e.name, flat[e.start:e.end].view(e.dtype).view(e.shape)) for e in entries]


def sglang_payload(flat: torch.Tensor, entries: list[FlatEntry], tp_size: int = 1) -> list:
    """A flat bucket as `Engine.update_weights_from_tensor(..., load_format="flattened_bucket")` takes it:
    one serialized {"flattened_tensor", "metadata"} per inference TP rank (SGLang's own metadata class, the
    one its scheduler unpickles)."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    metadata = [FlattenedTensorMetadata(name=e.name, shape=e.shape, dtype=e.dtype, start_idx=e.start,
                                        end_idx=e.end, numel=e.end - e.start) for e in entries]
    payload = MultiprocessingSerializer.serialize({"flattened_tensor": flat, "metadata": metadata})
    return [payload] * tp_size
