"""Validation prompts: every row once, in file order, sharded over DP ranks with equal counts.

Every rank must run the same number of generate calls (collectives inside the engine), so the row list is
padded to ``ceil(num_rows / dp_size) * dp_size`` by repeating rows from the start, and rank ``r`` takes the
``r``-th contiguous slice. Each slot comes with ``keep``: False on a padding duplicate. Metrics must drop
those slots: sum ``value * keep`` and ``keep`` on each rank, all-reduce both sums over DP, then divide
(``rlhf_mcore.trainer.scoring.source_sums`` does the per-rank half). Every real row is then counted exactly once.

>>> validation_shard(5, dp_rank=1, dp_size=2)
([3, 4, 0], [True, True, False])
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence


def validation_shard(num_rows: int, dp_rank: int, dp_size: int) -> tuple[list[int], list[bool]]:
    """Row indices of this rank and their keep flags (False on padding duplicates)."""
    if num_rows <= 0:
        raise ValueError("validation set is empty")
    if dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"need 0 <= dp_rank < dp_size (got {dp_rank}, {dp_size})")
    per_rank = -(-num_rows // dp_size)
    slots = range(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    return [s % num_rows for s in slots], [s < num_rows for s in slots]


class ValidationSampler:
    """This DP rank's share of a validation dataset (no shuffle, all rows, equal count on every rank)."""

    def __init__(self, dataset: Sequence[Any], *, dp_rank: int = 0, dp_size: int = 1):
        self.dataset = dataset
        self.indices, self.keep = validation_shard(len(dataset), dp_rank, dp_size)

    def shard(self) -> tuple[list[Any], list[bool]]:
        """All of this rank's rows and their keep flags."""
        return [self.dataset[i] for i in self.indices], list(self.keep)

    def batches(self, batch_size: int = 0) -> Iterator[tuple[list[Any], list[bool]]]:
        """This rank's rows in chunks of ``batch_size`` (0 = one chunk); same chunk count on every rank."""
        rows, keep = self.shard()
        size = batch_size or len(rows)
        for start in range(0, len(rows), size):
            yield rows[start:start + size], keep[start:start + size]
