"""The native engine's eager path for a vision LM (`models.vision`): image embeddings in the prefill, M-RoPE
positions for every KV-cache slot.

Megatron's static-batching cache keeps keys without rotation and rotates the whole cache [0, offset + s) at every
forward with the table it gets, so a forward over a chunk takes positions [3, b, offset + s] of all its slots: a
left-padded prompt's tokens at their M-RoPE positions (`models.mrope`, counted from the row's first real token, as
the trainer counts them), generated token k (0-based, past the prompt's L tokens) at L + k + delta on the three
axes, padding slots 0 (masked out). The prefill's input is the word embeddings with the images' rows in place
(`models.vision.merge_image_embeddings`); decode steps embed their token as usual.
"""
from __future__ import annotations

from typing import Sequence

import torch

from rlhf_mcore.models.mrope import decode_position_ids, mrope_position_ids
from rlhf_mcore.models.vision import VisionSide, image_embeddings, merge_images

Images = tuple[torch.Tensor, torch.Tensor] | None  # (pixel_values [p, D], image_grid_thw [i, 3]) of one row


def chunk_grids(images: Sequence[Images], device) -> torch.Tensor | None:
    """image_grid_thw [I, 3] of the chunk's rows in row order, None without any image."""
    present = [im for im in images if im is not None]
    return torch.cat([g for _, g in present]).to(device) if present else None


def chunk_image_embeddings(tower, images: Sequence[Images], merge: int, device) -> torch.Tensor:
    """[num_image_tokens, h] of the chunk's rows in row order, the tower run once per prompt: the n samples of a
    prompt hold the same (pixels, grids) object (`row_images`), so each distinct object is embedded once."""
    present = [im for im in images if im is not None]
    owners = list({id(im): im for im in present}.values())
    pixels = torch.cat([p for p, _ in owners]).to(device)
    embeddings = image_embeddings(tower, pixels, torch.cat([g for _, g in owners]).to(device))
    if len(owners) == len(present):
        return embeddings
    sizes = [int(g.prod(-1).sum()) // (merge * merge) for _, g in owners]
    chunks = dict(zip((id(im) for im in owners), embeddings.split(sizes)))
    return torch.cat([chunks[id(im)] for im in present])


def slot_positions(prompt: torch.Tensor, valid: torch.Tensor, grids: torch.Tensor | None, side: VisionSide,
                   max_new: int) -> torch.Tensor:
    """[3, b, P + max_new] M-RoPE positions of the cache slots of a left-padded chunk (prompt, valid: [b, P]).

    >>> side = VisionSide(None, image_token_id=9, video_token_id=8, merge=2)
    >>> slot_positions(torch.tensor([[0, 5, 9, 5]]), torch.tensor([[False, True, True, True]]),
    ...                torch.tensor([[1, 2, 2]]), side, 2)[:, 0].tolist()
    [[0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4]]
    """
    prompt_pos, deltas = mrope_position_ids(prompt, grids, side.image_token_id, side.merge, valid)
    decode = decode_position_ids(valid.sum(1), max_new, deltas)  # [3, b, max_new]
    return torch.cat([prompt_pos, decode], dim=2)


def prefill_input(model, side: VisionSide, prompt: torch.Tensor, images: Sequence[Images]) -> torch.Tensor:
    """decoder_input [P, b, h] of the prefill: the word embeddings, image tokens' rows from the tower (once per
    prompt, `chunk_image_embeddings`)."""
    if bool((prompt == side.video_token_id).any()):
        raise ValueError("rollout prompts: video tokens are not supported yet (images only). Use images.")
    embeddings = model.embedding(input_ids=prompt, position_ids=None)
    if all(im is None for im in images):
        if bool((prompt == side.image_token_id).any()):
            raise ValueError("rollout prompts: image tokens without images. Pass each prompt's images with it.")
        return merge_images(side, embeddings, prompt, None)
    images = chunk_image_embeddings(side.tower, images, side.merge, prompt.device)
    return merge_images(side, embeddings, prompt, images)  # DeepStack (Qwen3-VL): staged for the prefill's hooks


def row_images(images: Sequence[Images] | None, n: int, num_prompts: int) -> list[Images]:
    """Per row (prompt i's n samples are rows i * n .. i * n + n - 1) its prompt's images."""
    if images is None:
        return [None] * (num_prompts * n)
    if len(images) != num_prompts:
        raise ValueError(f"rollout: {len(images)} image entries for {num_prompts} prompts. Give one per prompt.")
    return [im for im in images for _ in range(n)]


def attach_images(batch, images: Sequence[Images] | None, per_row: Sequence[Images], device):
    """Give a rollout batch its rows' images (pixel_values [B, P_max, D], image_grid_thw [B, I_max, 3]), which the
    trainer's log-prob and update passes need; a batch without images is left as it is. Every engine calls it."""
    if images is None or all(im is None for im in images):
        return batch
    from rlhf_mcore.models.vision_step import stack_row_images

    fields = stack_row_images(per_row, next(im[0].size(1) for im in images if im is not None), device)
    batch.pixel_values, batch.image_grid_thw = fields["pixel_values"], fields["image_grid_thw"]
    return batch
