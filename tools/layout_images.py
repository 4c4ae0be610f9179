"""A vision LM's rows for tools/check_layouts.py: one synthetic image per row, so every layout also checks the
tower, the image rows put into the embeddings and the M-RoPE positions (`models.vision_step`).

Each row gets an image of GRID = (1, 4, 4) patches (random pixels, the tower's patch size) whose merged tokens open
the row; random text never uses the image or video ids; the response starts after the image. The rows carry the
image as the trainer's step batch does (`stack_row_images`: pixel_values [B, P, D], image_grid_thw [B, 1, 3]).
"""
from __future__ import annotations

import torch

from rlhf_mcore.models.vision import DEFAULT_TOKENS

GRID = (1, 4, 4)


def is_vision_lm(hf: dict) -> bool:
    return "vision_config" in hf


def text_vocab(hf: dict) -> int:
    """The language model's vocabulary size (a vision LM's config.json may nest it in text_config)."""
    return hf.get("vocab_size") or hf["text_config"]["vocab_size"]


def add_images(batch: dict, hf: dict, seed: int) -> dict:
    """`batch` (check_layouts.synthetic_batch) with one image per row at its start.

    >>> hf = {"image_token_id": 9, "video_token_id": 8, "vision_config": {"patch_size": 1, "temporal_patch_size": 1,
    ...       "in_channels": 1, "spatial_merge_size": 2}}
    >>> b = add_images({"tokens": torch.full((1, 8), 9), "response_mask": torch.ones(1, 8)}, hf, 0)
    >>> b["tokens"].tolist(), b["response_mask"].tolist(), b["pixel_values"].shape, b["image_grid_thw"].tolist()
    ([[9, 9, 9, 9, 1, 1, 1, 1]], [[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]], torch.Size([1, 16, 1]), [[[1, 4, 4]]])
    """
    vision = hf["vision_config"]
    image_id, video_id = (hf.get(k, v) for k, v in DEFAULT_TOKENS.items())
    merge = vision.get("spatial_merge_size", 2)
    patches = GRID[0] * GRID[1] * GRID[2]
    count = patches // (merge * merge)  # image tokens a row
    dim = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    rows = batch["tokens"].size(0)
    tokens = batch["tokens"].clone()
    tokens[(tokens == image_id) | (tokens == video_id)] = 1  # text stays text
    tokens[:, :count] = image_id
    mask = batch["response_mask"].clone()
    mask[:, :count + 1] = 0  # the response follows the image
    g = torch.Generator().manual_seed(seed + 1)
    return {**batch, "tokens": tokens, "response_mask": mask,
            "pixel_values": torch.randn(rows, patches, dim, generator=g),
            "image_grid_thw": torch.tensor([GRID]).expand(rows, 1, 3).clone()}
