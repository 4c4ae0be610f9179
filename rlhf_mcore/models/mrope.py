"""Multimodal RoPE positions (Qwen2.5-VL's M-RoPE): every token gets three positions, temporal, height and width.

A text token has the same position on all three axes, one past the previous token's largest. An image's tokens
(its `t x h x w` patches merged `merge x merge` into `t x h/merge x w/merge` tokens, row-major) sit on their
grid: temporal `start + i`, height `start + row`, width `start + column`, where `start` is the next text position;
the text after the image continues at `start + max(h, w) / merge`. This is transformers' `get_rope_index` for
still images (its `time_interval` is 1 for them). Padding positions are 0, as in transformers.

`rope_deltas` (largest position + 1 - number of tokens, per row) is what the positions of tokens generated after
the prompt are offset by: token `k` of a row (0-based, prompt included) sits at `k + delta` on all three axes.
"""
from __future__ import annotations

from typing import Iterator

import torch


def grid_positions(grid_thw: tuple[int, int, int], merge: int, start: int) -> torch.Tensor:
    """[3, t * h/merge * w/merge] positions of one image's tokens (row-major), offset by `start`.

    >>> grid_positions((1, 4, 6), 2, 5).tolist()
    [[5, 5, 5, 5, 5, 5], [5, 5, 5, 6, 6, 6], [5, 6, 7, 5, 6, 7]]
    """
    t, h, w = grid_thw[0], grid_thw[1] // merge, grid_thw[2] // merge
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1) + start


def image_token_count(grid_thw: tuple[int, int, int], merge: int) -> int:
    """How many LM tokens an image of patch grid (t, h, w) takes after the merger.

    >>> image_token_count((1, 4, 6), 2)
    6
    """
    return grid_thw[0] * grid_thw[1] * grid_thw[2] // (merge * merge)


def row_positions(is_image: list[bool], grids: Iterator[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """[3, L] positions of one row's valid tokens; `is_image`: which are image tokens, `grids`: the (t, h, w) of the
    row's images in order (consumed).

    >>> row_positions([False, True, True, False], iter([(1, 2, 4)]), 2).tolist()
    [[0, 1, 1, 3], [0, 1, 1, 3], [0, 1, 2, 3]]
    """
    pieces, pos, i, length = [], 0, 0, len(is_image)
    while i < length:
        if is_image[i]:
            grid = tuple(int(g) for g in next(grids))
            count = image_token_count(grid, merge)
            if not all(is_image[i:i + count]) or i + count > length:
                raise ValueError(f"input_ids: an image of grid {list(grid)} needs {count} image tokens in a row at "
                                 f"token {i}. Give each image as many <|image_pad|> tokens as its grid says.")
            pieces.append(grid_positions(grid, merge, pos))
            pos, i = pos + max(grid[1], grid[2]) // merge, i + count
        else:
            end = next((j for j in range(i, length) if is_image[j]), length)
            pieces.append(torch.arange(pos, pos + end - i).expand(3, -1))
            pos, i = pos + end - i, end
    return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)


def mrope_position_ids(input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, image_token_id: int,
                       merge: int, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [3, B, S], rope_deltas [B]) of a batch: input_ids [B, S], image_grid_thw [num_images, 3] (the
    batch's images in row order), attention_mask [B, S] (1 = token; None = all). Padding gets position 0."""
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    grids = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    positions = torch.zeros(3, *input_ids.shape, dtype=torch.long)
    deltas = torch.zeros(input_ids.size(0), dtype=torch.long)
    for b in range(input_ids.size(0)):
        ids = input_ids[b][valid[b]].cpu()
        row = row_positions((ids == image_token_id).tolist(), grids, merge)
        positions[:, b, valid[b].cpu()] = row
        deltas[b] = (row.max() + 1 - ids.numel()) if ids.numel() else 0
    if next(grids, None) is not None:
        raise ValueError("image_grid_thw: more images than input_ids has image tokens for. Give each image its "
                         "<|image_pad|> tokens.")
    return positions.to(input_ids.device), deltas.to(input_ids.device)


def decode_position_ids(start: torch.Tensor, length: int, deltas: torch.Tensor) -> torch.Tensor:
    """[3, B, length] positions of tokens `start[b] .. start[b] + length - 1` (0-based token indices) past a
    prompt with M-RoPE offsets `deltas` [B]: text tokens, the same on all three axes.

    >>> decode_position_ids(torch.tensor([7]), 2, torch.tensor([-3]))[:, 0].tolist()
    [[4, 5], [4, 5], [4, 5]]
    """
    rows = start[:, None] + torch.arange(length, device=start.device)[None] + deltas[:, None]
    return rows[None].expand(3, -1, -1)


def interleaved_axes(section: tuple[int, int, int]) -> list[int]:
    """The axis (0 t, 1 h, 2 w) of each rotary frequency in Qwen3-VL's interleaved M-RoPE (transformers'
    `Qwen3VLTextRotaryEmbedding`: h at frequencies 1, 4, 7, ... below 3 * h, w at 2, 5, 8, ... below 3 * w, t
    elsewhere). Qwen2.5-VL's layout is contiguous instead: t's frequencies, then h's, then w's.

    >>> interleaved_axes((2, 1, 1))
    [0, 1, 2, 0]
    """
    t, h, w = section
    return [1 if j % 3 == 1 and j < 3 * h else 2 if j % 3 == 2 and j < 3 * w else 0 for j in range(t + h + w)]


def interleaved_mrope_section(section: tuple[int, int, int]) -> list[int]:
    """Interleaved M-RoPE as chunk sizes for megatron's contiguous `MultimodalRotaryEmbedding`, which gives chunk i
    of the frequencies to axis i % 3 (zero-size chunks skip an axis): the same cos / sin table, no new module.

    >>> interleaved_mrope_section((2, 1, 1))  # t h w t
    [1, 1, 1, 1, 0, 0]
    >>> sum(interleaved_mrope_section((24, 20, 20))), len(interleaved_mrope_section((24, 20, 20))) % 3
    (64, 0)
    """
    chunks: list[int] = []
    for axis in interleaved_axes(section):
        if chunks and (len(chunks) - 1) % 3 == axis:
            chunks[-1] += 1
            continue
        while len(chunks) % 3 != axis:
            chunks.append(0)
        chunks.append(1)
    return chunks + [0] * (-len(chunks) % 3)
