"""A training micro-batch through a vision LM (`models.vision`): what `trainer.schedule` passes to the model.

A step batch carries its rows' images as two per-row fields (`stack_row_images`):
pixel_values [B, P_max, D] and image_grid_thw [B, I_max, 3] (zero-padded). For a micro-batch, padded
(tokens [b, s]) or packed (tokens [1, T], `data.packing`), the forward
1. runs the tower + merger on the micro-batch's images (rows in order) -> one embedding per image token, once per
   prompt: the n samples of a prompt (one `group_index`, equal pixels) share its embeddings;
2. puts them at the `<|image_pad|>` tokens of the LM's word embeddings, in row-major order (for a packed row that
   is the rows back to back, the same order), and hands those to the decoder as `decoder_input`;
3. gives every token its M-RoPE position [3, b, s] (`models.mrope`): per row from its first token, for a packed
   row per segment, concatenated (megatron's multimodal rotary table is built per token from them, so the
   packing hook that re-indexes a 1-D table is switched off: `PackedSeqs.position_ids=None`).
A text row of a vision LM takes the same path (its positions are the same on the three axes).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from rlhf_mcore.models.mrope import mrope_position_ids, row_positions
from rlhf_mcore.models.vision import VisionSide, image_embeddings, merge_images


def stack_row_images(per_row: Sequence[tuple[torch.Tensor, torch.Tensor] | None], patch_dim: int,
                     device) -> dict[str, torch.Tensor]:
    """Rows' images as per-row fields of a step batch: pixel_values [B, P_max, D] (a row's patches first, zeros
    after) and image_grid_thw [B, I_max, 3] (zero rows after a row's grids). `per_row[b]`: (pixels [p, D],
    grids [i, 3]) or None for a row without images.

    >>> f = stack_row_images([(torch.ones(2, 3), torch.tensor([[1, 1, 2]])), None], 3, "cpu")
    >>> f["pixel_values"].shape, f["image_grid_thw"].tolist()
    (torch.Size([2, 2, 3]), [[[1, 1, 2]], [[0, 0, 0]]])
    """
    num = len(per_row)
    patches = max((p.size(0) for p, _ in filter(None, per_row)), default=0)
    count = max((g.size(0) for _, g in filter(None, per_row)), default=0)
    pixels = torch.zeros(num, max(patches, 1), patch_dim)
    grids = torch.zeros(num, max(count, 1), 3, dtype=torch.long)
    for b, item in enumerate(per_row):
        if item is not None:
            pixels[b, :item[0].size(0)] = item[0]
            grids[b, :item[1].size(0)] = item[1]
    return {"pixel_values": pixels.to(device), "image_grid_thw": grids.to(device)}


def row_images(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Undo `stack_row_images` over rows, in row order: (pixel_values [num_patches, D], grids [num_images, 3]).

    >>> f = stack_row_images([(torch.ones(2, 3), torch.tensor([[1, 1, 2]])), None], 3, "cpu")
    >>> [t.shape for t in row_images(f["pixel_values"], f["image_grid_thw"])]
    [torch.Size([2, 3]), torch.Size([1, 3])]
    """
    pixels, grids = [], []
    for b in range(image_grid_thw.size(0)):
        g = image_grid_thw[b][image_grid_thw[b].prod(-1) > 0]
        grids.append(g)
        pixels.append(pixel_values[b, :int(g.prod(-1).sum())])
    return torch.cat(pixels), torch.cat(grids)


def micro_batch_grids(mb: dict) -> torch.Tensor | None:
    """image_grid_thw [num_images, 3] of the micro-batch's rows, in row order; None without images."""
    if "image_grid_thw" not in mb or not bool((mb["image_grid_thw"] > 0).any()):
        return None
    grids = mb["image_grid_thw"]
    return grids.reshape(-1, 3)[grids.reshape(-1, 3).prod(-1) > 0]


def first_rows(mb: dict) -> list[int]:
    """Per row, the first row of the micro-batch whose images it shares: the first of its group (`group_index`: the
    n samples of a prompt carry the prompt's images) whose grids and pixels are equal to its own, else itself.

    >>> px = torch.tensor([[[1.]], [[2.]], [[1.]], [[3.]]])
    >>> first_rows({"pixel_values": px, "image_grid_thw": torch.ones(4, 1, 3, dtype=torch.long),
    ...             "group_index": torch.tensor([7, 8, 7, 8])})
    [0, 1, 0, 3]
    """
    num = mb["image_grid_thw"].size(0)
    keys = mb["group_index"].tolist() if "group_index" in mb else list(range(num))
    first, out = {}, []
    for b in range(num):
        a = first.setdefault(keys[b], b)
        same = a == b or (torch.equal(mb["image_grid_thw"][a], mb["image_grid_thw"][b])
                          and torch.equal(mb["pixel_values"][a], mb["pixel_values"][b]))
        out.append(a if same else b)
    return out


def shared_image_embeddings(tower, mb: dict, merge: int) -> torch.Tensor:
    """[num_image_tokens, h] of the micro-batch's rows in row order, the tower run once per distinct row of
    images (`first_rows`: once per prompt, not per sample); a row that shares takes its first row's embeddings
    (when the tower trains, their gradients add up there, as they would over separate copies)."""
    firsts = first_rows(mb)
    owners = sorted(set(firsts))
    pixels, grids = row_images(mb["pixel_values"][owners], mb["image_grid_thw"][owners])
    embeddings = image_embeddings(tower, pixels, grids)
    if len(owners) == len(firsts):
        return embeddings
    counts = (mb["image_grid_thw"].prod(-1).sum(-1) // (merge * merge)).tolist()  # image tokens per row
    chunks = dict(zip(owners, embeddings.split([counts[a] for a in owners])))
    return torch.cat([chunks[a] for a in firsts])


def packed_mrope_positions(tokens: torch.Tensor, cu_seqlens: torch.Tensor, num_rows: int,
                           grids: torch.Tensor | None, image_token_id: int, merge: int) -> torch.Tensor:
    """[3, 1, T] positions of a packed row (tokens [1, T]): each of the first `num_rows` segments from 0, the
    tail padding 0.

    >>> packed_mrope_positions(torch.tensor([[5, 9, 5, 5, 9, 9, 0]]), torch.tensor([0, 2, 6, 7]), 2,
    ...                        torch.tensor([[1, 2, 2], [1, 2, 4]]), 9, 2)[:, 0].tolist()
    [[0, 1, 0, 1, 2, 2, 0], [0, 1, 0, 1, 2, 2, 0], [0, 1, 0, 1, 2, 3, 0]]
    """
    ids = tokens[0].cpu()
    out = torch.zeros(3, 1, ids.numel(), dtype=torch.long)
    grid_iter = iter(grids.tolist() if grids is not None else [])
    bounds = cu_seqlens.tolist()
    for r in range(num_rows):
        start, end = bounds[r], bounds[r + 1]
        out[:, 0, start:end] = row_positions((ids[start:end] == image_token_id).tolist(), grid_iter, merge)
    return out.to(tokens.device)


def prompt_ids(mb: dict, packed: bool) -> torch.Tensor:
    """The micro-batch's tokens with every token past its row's prompt (`prompt_lengths`) set to -1: the images and
    their grid positions are the prompt's; a sampled response token that happens to be an image or video id is
    text (its word embedding, the next text position), as it was in the rollout.

    >>> prompt_ids({"tokens": torch.tensor([[4, 9, 9, 5, 9, 0]]), "prompt_lengths": torch.tensor([2, 3]),
    ...             "cu_seqlens": torch.tensor([0, 3, 6])}, packed=True).tolist()
    [[4, 9, -1, 5, 9, 0]]
    """
    tokens = mb["tokens"]
    if "prompt_lengths" not in mb:
        return tokens
    if not packed:
        cols = torch.arange(tokens.size(1), device=tokens.device)[None]
        return tokens.masked_fill(cols >= mb["prompt_lengths"][:, None], -1)
    out, bounds = tokens.clone(), mb["cu_seqlens"].tolist()
    for r, length in enumerate(mb["prompt_lengths"].tolist()):
        out[0, bounds[r] + length:bounds[r + 1]] = -1
    return out


def vision_inputs(lm, side: VisionSide, mb: dict, packed: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(M-RoPE positions [3, b, s], decoder_input [s, b, h]) of a micro-batch (`lm`: the unwrapped GPTModel). A
    later pipeline stage (no embedding: its input comes from the previous stage) gets the positions only, which
    every stage's rotary table needs; the tower runs on the first stage."""
    tokens, layout = mb["tokens"], prompt_ids(mb, packed)
    if bool((layout == side.video_token_id).any()):
        raise ValueError("input_ids: video tokens are not supported yet (images only). Use images.")
    grids = micro_batch_grids(mb)
    if grids is None and bool((layout == side.image_token_id).any()):
        raise ValueError("input_ids: image tokens without pixel_values. Pass the images with their tokens.")
    embeddings = None
    if getattr(lm, "pre_process", True):
        embeddings = lm.embedding(input_ids=tokens, position_ids=None)  # [s, b, h]
        images = None if grids is None else shared_image_embeddings(side.tower, mb, side.merge)
        embeddings = merge_images(side, embeddings, layout, images)  # DeepStack (Qwen3-VL): staged for the hooks
    if packed:
        positions = packed_mrope_positions(layout, mb["cu_seqlens"], mb["row_index"].numel(), grids,
                                           side.image_token_id, side.merge)
    else:
        valid = torch.arange(tokens.size(1), device=tokens.device)[None] < mb["lengths"][:, None]
        positions, _ = mrope_position_ids(layout, grids, side.image_token_id, side.merge, valid)
    return positions, embeddings


def packed_without_positions(params):
    """The packed params with no 1-D positions (the M-RoPE table is already per token)."""
    return dataclasses.replace(params, position_ids=None)
