"""Every GPU rolls out: a DP replica's rows are split over all its TP x PP ranks, each rank generates its
share with its own engine, and every rank gets all the replica's results back in row order.

Pure bookkeeping around a `generate_rows(rows) -> results` callable, so the split and the reassembly are
the same code on CPU (gloo, tests) and on GPUs (NCCL, the embedded engine behind the callable).
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch.distributed as dist

R = TypeVar("R")


def share(num_rows: int, parts: int, part: int) -> slice:
    """Rows of `part` out of `parts`: contiguous and balanced (the first num_rows % parts get one more).

    >>> [share(7, 3, p) for p in range(3)]
    [slice(0, 3, None), slice(3, 5, None), slice(5, 7, None)]
    >>> share(1, 4, 3)
    slice(1, 1, None)
    """
    base, extra = divmod(num_rows, parts)
    start = part * base + min(part, extra)
    return slice(start, start + base + (part < extra))


def group_size_and_rank(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def generate_shared(rows: Sequence, generate_rows: Callable[[list], list[R]], group) -> list[R]:
    """Collective over `group`: every rank passes the same `rows`, generates only its `share`, and returns
    the results of all rows in order (all-gathered as Python objects)."""
    size, rank = group_size_and_rank(group)
    mine = list(rows[share(len(rows), size, rank)])
    local = generate_rows(mine) if mine else []
    if len(local) != len(mine):
        raise RuntimeError(f"rollout engine: {len(local)} results for {len(mine)} rows on rank {rank} of {size}")
    if size == 1:
        return local
    parts: list = [None] * size
    dist.all_gather_object(parts, local, group=group)
    return [result for part in parts for result in part]
