"""Training prompt order: a seeded shuffle per epoch, global batches, each DP rank's share of every mini-batch.

The order is a pure function of ``(seed, epoch, position)``: every rank computes the same global batch of
``train_batch_size`` row indices and keeps its slice of every mini-batch (``rank_shard``), so an optimizer step
trains the same prompts at any DP size. ``state_dict``
stores ``epoch`` and ``position`` (batches already taken in that epoch), so a resumed run continues with
exactly the next batch, even under a different ``dp_size``.

drop_last: with ``drop_last=True`` an epoch has ``num_rows // B`` batches and the ``num_rows % B`` rows at the
end of that epoch's shuffle are skipped (different rows each epoch). With ``drop_last=False`` an epoch has
``ceil(num_rows / B)`` batches and the last one is filled up with rows from the start of the same epoch's
order, so every batch keeps its full size (GRPO groups and DP divisibility need that) and every row is seen
at least once per epoch.

>>> s = PromptSampler(list("abcdefg"), train_batch_size=3, seed=0, shuffle=False)
>>> s.steps_per_epoch, s.next_batch(), s.next_batch(), s.epoch, s.next_batch(), s.epoch
(2, ['a', 'b', 'c'], ['d', 'e', 'f'], 1, ['a', 'b', 'c'], 1)
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The row order of one epoch: a permutation seeded by ``(seed, epoch)``, or ``range`` without shuffle."""
    if not shuffle:
        return list(range(num_rows))
    return np.random.default_rng([seed, epoch]).permutation(num_rows).tolist()


def batches_per_epoch(num_rows: int, batch_size: int, drop_last: bool) -> int:
    """``num_rows // batch_size`` with drop_last, else ``ceil(num_rows / batch_size)``."""
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


def global_batch(order: Sequence[int], position: int, batch_size: int) -> list[int]:
    """Batch ``position`` of an epoch's ``order``, wrapping to its start when the epoch runs out.

    >>> global_batch([4, 2, 0, 1, 3], 1, 3)
    [1, 3, 4]
    """
    start = position * batch_size
    return [order[(start + k) % len(order)] for k in range(batch_size)]


def rank_shard(batch: Sequence, dp_rank: int, dp_size: int, chunk: int = 0) -> list:
    """This DP rank's share of a global batch: its slice of every `chunk` rows (a mini-batch), so that mini-batch k
    of every rank together is the global batch's mini-batch k at any DP size; one contiguous slice when `chunk` is
    0 or does not split evenly over the ranks.

    >>> rank_shard([0, 1, 2, 3, 4, 5], 1, 3)
    [2, 3]
    >>> rank_shard([0, 1, 2, 3, 4, 5, 6, 7], 1, 2, chunk=4)  # mini-batches [0..3] and [4..7], half of each
    [2, 3, 6, 7]
    """
    if len(batch) % dp_size:
        raise ValueError(f"batch of {len(batch)} cannot be split evenly over dp_size={dp_size}")
    if not chunk or chunk % dp_size or len(batch) % chunk:
        chunk = len(batch)
    part = chunk // dp_size
    return [x for start in range(0, len(batch), chunk)
            for x in batch[start + dp_rank * part:start + (dp_rank + 1) * part]]


class PromptSampler:
    """This DP rank's training prompts, one global step at a time, across epochs."""

    def __init__(
        self,
        dataset: Sequence[Any],
        train_batch_size: int,
        *,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        mini_batch_size: int = 0,
    ):
        """`mini_batch_size`: prompts per optimizer step (global); each rank takes its share of every one
        (`rank_shard`), so a mini-batch holds the same prompts at any DP size."""
        _check_layout(train_batch_size, dp_rank, dp_size)
        self.dataset, self.train_batch_size = dataset, train_batch_size
        self.dp_rank, self.dp_size, self.mini_batch_size = dp_rank, dp_size, mini_batch_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.steps_per_epoch = batches_per_epoch(len(dataset), train_batch_size, drop_last)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"data.train_batch_size: larger than the dataset ({train_batch_size} > {len(dataset)} prompts) "
                "with drop_last. Lower it or use drop_last=False."
            )
        self.epoch, self.position = 0, 0
        self._order: list[int] | None = None  # cached order of self.epoch

    def next_indices(self) -> list[int]:
        """Dataset indices of this rank's share of the next global batch; advances the state."""
        if self._order is None:
            self._order = epoch_order(len(self.dataset), self.seed, self.epoch, self.shuffle)
        batch = global_batch(self._order, self.position, self.train_batch_size)
        self.position += 1
        if self.position == self.steps_per_epoch:
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        return rank_shard(batch, self.dp_rank, self.dp_size, self.mini_batch_size)

    def next_batch(self) -> list[Any]:
        """This rank's ``train_batch_size / dp_size`` rows of the next global batch."""
        return [self.dataset[i] for i in self.next_indices()]

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch, "position": self.position, "seed": self.seed,
            "num_rows": len(self.dataset), "train_batch_size": self.train_batch_size,
            "shuffle": self.shuffle, "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; raises when the data or batch layout it describes has changed."""
        for key in ("seed", "num_rows", "train_batch_size", "shuffle", "drop_last"):
            mine = len(self.dataset) if key == "num_rows" else getattr(self, key)
            if key in state and state[key] != mine:
                raise ValueError(
                    f"sampler state: {key} was {state[key]!r} when saved but is {mine!r} now; resuming would "
                    "not continue the same prompt order. Restore the old setting or start a fresh run."
                )
        if not 0 <= state["position"] < self.steps_per_epoch or state["epoch"] < 0:
            raise ValueError(f"sampler state: position/epoch out of range (got {state})")
        self.epoch, self.position, self._order = int(state["epoch"]), int(state["position"]), None


def _check_layout(train_batch_size: int, dp_rank: int, dp_size: int) -> None:
    if train_batch_size <= 0 or dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise ValueError(
            f"sampler: need train_batch_size > 0 and 0 <= dp_rank < dp_size "
            f"(got {train_batch_size}, {dp_rank}, {dp_size})"
        )
    if train_batch_size % dp_size:
        raise ValueError(
            f"data.train_batch_size: must be divisible by the data-parallel size {dp_size} "
            f"(got {train_batch_size}). Use a multiple of {dp_size}."
        )
