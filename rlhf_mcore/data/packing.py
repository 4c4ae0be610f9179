"""Sequence packing (`data.use_sequence_packing`): the valid tokens of several rows back to back, no padding.

A step batch holds rows [B, S] right-padded, with `lengths` [B]. A packed micro-batch holds
  tokens        [1, T]  the rows' valid tokens back to back; T = their total rounded up to `multiple`
                        (sequence parallelism splits T over TP ranks), the tail being zeros
  position_ids  [1, T]  0 .. len_i - 1 within each row: RoPE restarts at every boundary
  cu_seqlens    [n_seg + 1] int32 segment boundaries; the tail padding, if any, is a segment of its own
  max_seqlen    int (host) the longest segment
  unpack_index  [n, L]  where token t of row i sits in `tokens`, or T (a zero slot) past its length
  row_index     [n]     the rows' indices in the step batch
and every other field of its n rows in the padded row layout, trimmed to L = their longest length. Model
outputs [1, T] go back to that layout with `to_rows`, so the loss maths never sees the packing.

Rows go to micro-batches by `plan_bins`: the fewest bins under the token budget, each filled longest row
first into the lightest bin (balanced micro-batches); `plan_dp_split` gives DP ranks equal row counts and
balanced token counts the same way. The budget (`token_budget`) is `max_tokens_per_gpu` when set, else the
token slots of the largest padded micro-batch of the same rows (rows x the longest row), so that a packed
micro-batch never holds more tokens, nor more activations, than a padded one would.
"""
from __future__ import annotations

import heapq

import torch
import torch.nn.functional as F

Batch = dict
ROW_FIELDS = ("pixel_values", "image_grid_thw")  # per-row fields whose dim 1 is not the sequence (a row's images)


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _fill(lengths: list[int], num_bins: int, capacity: int, max_rows: int) -> list[list[int]] | None:
    """Longest row first into the lightest bin with room (and fewer than max_rows rows); None if one
    does not fit. A row longer than the capacity fits only an empty bin."""
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    heap = [(0, b) for b in range(num_bins)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        skipped, placed = [], False
        while heap:
            load, b = heapq.heappop(heap)
            if len(bins[b]) < max_rows and (load + lengths[i] <= capacity or not bins[b]):
                bins[b].append(i)
                heapq.heappush(heap, (load + lengths[i], b))
                placed = True
                break
            skipped.append((load, b))
        for item in skipped:
            heapq.heappush(heap, item)
        if not placed:
            return None
    return [sorted(b) for b in bins if b]


def token_budget(lengths: list[int], micro_batch_size: int, max_tokens: int = 0, multiple: int = 1) -> int:
    """Tokens per packed micro-batch: `max_tokens` when set (> 0), else auto: `micro_batch_size` rows of the
    longest row (rounded up to `multiple`), the token slots of the largest padded micro-batch these rows make.

    >>> token_budget([300, 512, 90], micro_batch_size=8)  # 8 padded rows of 512
    4096
    >>> token_budget([300, 511, 90], micro_batch_size=8, multiple=4)
    4096
    >>> token_budget([300, 512, 90], micro_batch_size=8, max_tokens=8192)
    8192
    """
    if max_tokens > 0:
        return max_tokens
    if micro_batch_size <= 0:
        raise ValueError(f"token_budget: an automatic budget needs micro_batch_size > 0 (got {micro_batch_size})")
    return micro_batch_size * round_up(max(lengths, default=1), multiple)


def plan_bins(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices per micro-batch: the fewest balanced bins whose token sums stay <= max_tokens.

    >>> plan_bins([5, 3, 4, 2], 8)
    [[0, 3], [1, 2]]
    >>> plan_bins([9, 1], 8)  # a row over the budget goes alone
    [[0], [1]]
    """
    if not lengths:
        return []
    num_bins = max(1, round_up(sum(lengths), max_tokens) // max_tokens)
    while (bins := _fill(lengths, num_bins, max_tokens, len(lengths))) is None:
        num_bins += 1
    return sorted(bins)


def plan_dp_split(lengths: list[int], num_ranks: int) -> list[list[int]]:
    """Rows per DP rank: equal row counts (len(lengths) must divide), balanced token sums.

    >>> plan_dp_split([8, 1, 7, 2], 2)
    [[0, 1], [2, 3]]
    """
    rows = len(lengths) // num_ranks
    if rows * num_ranks != len(lengths):
        raise ValueError(f"{len(lengths)} rows do not split evenly over {num_ranks} DP ranks")
    bins = _fill(lengths, num_ranks, sum(lengths), rows)  # never None: the capacity is the total
    return sorted(bins)


def pack_rows(batch: Batch, rows: list[int], lengths: list[int], multiple: int = 1) -> Batch:
    """The packed micro-batch of `rows` (indices into `batch`; `lengths` are all rows' lengths, on host)."""
    device = batch["tokens"].device
    seq = batch["tokens"].size(1)
    lens = torch.tensor([lengths[i] for i in rows])
    ends = torch.cumsum(lens, 0)
    starts = ends - lens
    total = int(ends[-1])
    padded = round_up(total, multiple)
    seg = torch.repeat_interleave(torch.arange(len(rows)), lens)  # [total] row of each packed token
    pos = torch.arange(total) - starts[seg]
    flat = torch.tensor(rows)[seg] * seq + pos
    width = int(lens.max())
    col = torch.arange(width).unsqueeze(0)
    unpack = torch.where(col < lens.unsqueeze(1), starts.unsqueeze(1) + col, padded)  # [n, L]
    cu = torch.cat([torch.zeros(1, dtype=torch.long), ends] + ([torch.tensor([padded])] if padded > total else []))
    pos = torch.cat([pos, torch.arange(padded - total)])
    index = torch.tensor(rows, device=device)
    out = {k: (v[index, :width] if v.dim() >= 2 and k not in ROW_FIELDS else v[index]) for k, v in batch.items()}
    out.update({
        "tokens": F.pad(batch["tokens"].reshape(-1)[flat.to(device)], (0, padded - total)).unsqueeze(0),
        "position_ids": pos.to(device).unsqueeze(0),
        "cu_seqlens": cu.to(device=device, dtype=torch.int32),
        "max_seqlen": max(width, padded - total),
        "unpack_index": unpack.to(device),
        "row_index": index,
    })
    return out


def split_packed(batch: Batch, max_tokens: int, multiple: int = 1, lengths: list[int] | None = None) -> list[Batch]:
    """Balanced packed micro-batches of a step batch under the token budget (max_tokens > 0); `lengths`:
    batch["lengths"] on the host, if the caller has it already (saves a device sync)."""
    lengths = batch["lengths"].tolist() if lengths is None else lengths
    return [pack_rows(batch, rows, lengths, multiple) for rows in plan_bins(lengths, max_tokens)]


def is_packed(mb: Batch) -> bool:
    return "unpack_index" in mb


def to_rows(x: torch.Tensor, mb: Batch, *, shift: bool = False, keep_first: bool = False) -> torch.Tensor:
    """Packed per-token output [1, T] -> row layout [n, L] (differentiable), 0 past each row's length.

    Column 0 is 0 (nothing predicts a row's first token) unless keep_first; with shift, column t holds
    the output at token t - 1 (values: the state before token t)."""
    index = mb["unpack_index"]
    slot = x.size(1)
    if shift:
        index = F.pad(index[:, :-1], (1, 0), value=slot)
    elif not keep_first:
        index = F.pad(index[:, 1:], (1, 0), value=slot)
    return F.pad(x[0], (0, 1))[index]


def padding_stats(lengths: list[int], micro_batches: list[list[int]], multiple: int = 1, packed: bool = False) -> dict:
    """Real tokens, computed token slots and the padding fraction of a micro-batch plan.

    >>> padding_stats([4, 2], [[0, 1]])
    {'real_tokens': 6, 'computed_tokens': 8, 'padding_fraction': 0.25}
    >>> padding_stats([4, 2], [[0, 1]], packed=True)
    {'real_tokens': 6, 'computed_tokens': 6, 'padding_fraction': 0.0}
    """
    real = sum(lengths)
    computed = sum(round_up(sum(lengths[i] for i in mb), multiple) if packed else
                   len(mb) * round_up(max(lengths[i] for i in mb), multiple) for mb in micro_batches)
    return {"real_tokens": real, "computed_tokens": computed, "padding_fraction": 1 - real / max(computed, 1)}
