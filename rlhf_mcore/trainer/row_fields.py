"""A vision LM's per-row image fields (`data.packing.ROW_FIELDS`: pixel_values [B, P, D] and image_grid_thw [B, I, 3],
zero-padded; dim 1 holds a row's images, not the sequence) brought to one shape over several batches and the DP
ranks, so that they concatenate (the rounds of dynamic sampling) and gather (DP balancing, dynamic sampling's
exchange). The widths differ from batch to batch with the images' sizes, and a batch none of whose rows has an
image carries no such field at all: it gets zeros there, which read as "no image" (`models.vision_step`).

Collective over DP (one small all-reduce) when DP > 1, so every DP rank calls it at the same point.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlhf_mcore.data.packing import ROW_FIELDS

DTYPES = {"pixel_values": torch.float32, "image_grid_thw": torch.long}  # of a field made for a batch without it


def agreed_shapes(batches: Sequence[Mapping], ctx) -> dict[str, tuple[int, int]]:
    """{field: (dim 1, dim 2)} of each row field that some batch on some DP rank has: the largest over all of them.

    >>> px = {"pixel_values": torch.zeros(2, 5, 6), "image_grid_thw": torch.ones(2, 1, 3, dtype=torch.long)}
    >>> agreed_shapes([px, {"pixel_values": torch.zeros(2, 9, 6)}], ctx=None)
    {'pixel_values': (9, 6), 'image_grid_thw': (1, 3)}
    """
    shapes = torch.zeros(len(ROW_FIELDS), 2, dtype=torch.long)
    for i, key in enumerate(ROW_FIELDS):
        for batch in batches:
            if key in batch:
                shapes[i] = torch.maximum(shapes[i], torch.tensor(batch[key].shape[1:3]))
    if ctx is not None and ctx.dims.dp > 1:
        shapes = shapes.to(ctx.device)
        dist.all_reduce(shapes, op=dist.ReduceOp.MAX, group=ctx.pgs.dp)
    return {key: (int(w), int(d)) for key, (w, d) in zip(ROW_FIELDS, shapes.tolist()) if w > 0}


def uniform_row_fields(batches: Sequence[Mapping], ctx) -> list[dict[str, torch.Tensor]]:
    """Per batch, its row fields at the `agreed_shapes` (zero-padded along dim 1; zeros where it had none). A field
    no batch on any rank has is left out. Every batch has `tokens` (its rows and device).

    >>> a = {"tokens": torch.zeros(2, 4), "pixel_values": torch.ones(2, 1, 3),
    ...      "image_grid_thw": torch.ones(2, 1, 3, dtype=torch.long)}
    >>> out = uniform_row_fields([a, {"tokens": torch.zeros(1, 7), "pixel_values": torch.ones(1, 2, 3)}], ctx=None)
    >>> [tuple(f["pixel_values"].shape) for f in out], out[1]["image_grid_thw"].tolist()
    ([(2, 2, 3), (1, 2, 3)], [[[0, 0, 0]]])
    """
    shapes = agreed_shapes(batches, ctx)
    out = []
    for batch in batches:
        rows, device = batch["tokens"].size(0), batch["tokens"].device
        fields = {}
        for key, (width, depth) in shapes.items():
            t = batch.get(key)
            fields[key] = torch.zeros(rows, width, depth, dtype=DTYPES[key], device=device) if t is None else \
                F.pad(t, (0, 0, 0, width - t.size(1)))
        out.append(fields)
    return out
