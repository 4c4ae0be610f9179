"""The native engine with a vision LM (`models.vision`): image embeddings in the prefill, M-RoPE positions.

The static decoder (`VisionPrefill`, `static_prefill`): the prefill runs over the right-padded prompts with the
images' embeddings in place, each token's M-RoPE angles and DeepStack after its layers; a generated token is text,
the same position on the three axes, so a decode step takes the plain RoPE table at slot + the row's delta
(`DecodeState.rope_delta`) and stays CUDA-graphed.

The eager path (PP or TP > 1, or CUDA graphs off):

Megatron's static-batching cache keeps keys without rotation and rotates the whole cache [0, offset + s) at every
forward with the table it gets, so a forward over a chunk takes positions [3, b, offset + s] of all its slots: a
left-padded prompt's tokens at their M-RoPE positions (`models.mrope`, counted from the row's first real token, as
the trainer counts them), generated token k (0-based, past the prompt's L tokens) at L + k + delta on the three
axes, padding slots 0 (masked out). The prefill's input is the word embeddings with the images' rows in place
(`models.vision.merge_image_embeddings`); decode steps embed their token as usual.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from rlhf_mcore.models.mrope import decode_position_ids, mrope_position_ids
from rlhf_mcore.models.vision import VisionSide, add_deepstack, deepstack_levels, image_embeddings, merge_images

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


def image_layout(prompt: torch.Tensor, valid: torch.Tensor, spans: Sequence[int], side: VisionSide) -> torch.Tensor:
    """The chunk's ids [b, P] (`valid`: the rows' own columns, left- or right-padded) with every image or video token
    past its row's span set to -1 (text). spans[i]: how many of row i's ids are its prompt; ids after
    it were sampled, or written by a tool, in earlier turns of the sample (multi-turn, partial rollouts), and an
    image id among them is text, as the trainer reads every token past the prompt (`models.vision_step.prompt_ids`).

    >>> side = VisionSide(None, image_token_id=9, video_token_id=8, merge=2)
    >>> ids, valid = torch.tensor([[5, 9, 9, 6, 9, 8], [0, 9, 5, 9, 8, 5]]), torch.tensor([[1] * 6, [0] + [1] * 5])
    >>> image_layout(ids, valid.bool(), [4, 2], side).tolist()
    [[5, 9, 9, 6, -1, -1], [0, 9, 5, -1, -1, 5]]
    """
    column = valid.long().cumsum(1) - 1  # each column's index in its row
    past = column >= torch.tensor(list(spans), device=prompt.device)[:, None]
    return prompt.masked_fill(past & ((prompt == side.image_token_id) | (prompt == side.video_token_id)), -1)


def prefill_input(model, side: VisionSide, prompt: torch.Tensor, layout: torch.Tensor,
                  images: Sequence[Images]) -> torch.Tensor:
    """decoder_input [P, b, h] of the prefill: the word embeddings of `prompt`, the rows of `layout`'s image tokens
    (`image_layout`) from the tower (once per prompt, `chunk_image_embeddings`)."""
    if bool((layout == side.video_token_id).any()):
        raise ValueError("rollout prompts: video tokens are not supported yet (images only). Use images.")
    embeddings = model.embedding(input_ids=prompt, position_ids=None)
    if all(im is None for im in images):
        if bool((layout == side.image_token_id).any()):
            raise ValueError("rollout prompts: image tokens without images. Pass each prompt's images with it.")
        return merge_images(side, embeddings, layout, None)
    images = chunk_image_embeddings(side.tower, images, side.merge, prompt.device)
    return merge_images(side, embeddings, layout, images)  # DeepStack (Qwen3-VL): staged for the prefill's hooks


def row_spans(prompt_lengths: Sequence[int] | None, rows: Sequence[list[int]], n: int) -> list[int]:
    """Per row its prompt's span (`image_layout`); without `prompt_lengths`, the whole row."""
    if prompt_lengths is None:
        return [len(r) for r in rows]
    if len(prompt_lengths) * n != len(rows):
        raise ValueError(f"rollout: {len(prompt_lengths)} prompt lengths for {len(rows) // n} prompts. Give one each.")
    return [length for length in prompt_lengths for _ in range(n)]


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


@dataclasses.dataclass
class VisionPrefill:
    """What the static decoder's prefill of a vision LM's chunk takes (`StaticDecoder.forward`)."""

    hidden: torch.Tensor  # [P, b, h] the word embeddings with the images' rows in place
    freqs: torch.Tensor  # [P, b, 1, d] rotary angles at each token's M-RoPE position
    deltas: torch.Tensor  # [b] long, a generated token's position minus its cache slot
    side: VisionSide
    levels: int  # DeepStack levels (Qwen3-VL: added after LM layers 0..levels-1; Qwen2.5-VL: 0)

    def after_layer(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [P, b, h] after LM layer `layer`, plus its DeepStack level at the image tokens (the trainer's
        forward hook, `models.vision.add_deepstack`; the static decoder runs layers without their hooks)."""
        if layer >= self.levels:
            return hidden
        return add_deepstack(self.side, layer, None, None, (hidden, None))[0]


def static_prefill(model, side: VisionSide, prompt: torch.Tensor, lengths: torch.Tensor,
                   images: Sequence[Images], spans: Sequence[int]) -> VisionPrefill:
    """The `VisionPrefill` of a right-padded chunk (prompt [b, P], lengths [b]) and its rows' images. Positions
    count from each row's first token, as the trainer's (`models.mrope`); padding slots get position 0 and are
    overwritten by the row's response before any query reaches them. `spans`: `image_layout`'s."""
    valid = torch.arange(prompt.size(1), device=prompt.device)[None] < lengths[:, None]
    layout = image_layout(prompt, valid, spans, side)
    positions, deltas = mrope_position_ids(layout, chunk_grids(images, prompt.device), side.image_token_id,
                                           side.merge, valid)
    freqs = model.rotary_pos_emb(positions, model.mrope_section)
    return VisionPrefill(prefill_input(model, side, prompt, layout, images), freqs, deltas, side,
                         deepstack_levels(side.tower))
