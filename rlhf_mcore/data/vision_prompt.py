"""Prompts with images for a Qwen2.5-VL policy: token ids with the image tokens expanded, and the pixels.

What transformers' `Qwen2_5_VLProcessor` does, on our tokenizer interface:
1. every `<image>` placeholder of the messages becomes `<|vision_start|><|image_pad|><|vision_end|>` (the text
   the model's chat template writes for an image part: verl splits the content at `<image>` into parts, which
   renders the same), and the tokenizer's chat template renders the messages;
2. each image's single `<|image_pad|>` is expanded to t * h * w / merge^2 copies, (t, h, w) being its patch grid
   after the image processor's resize (`smart_resize`: both sides multiples of patch * merge, the area within
   min_pixels .. max_pixels);
3. the pixels come from transformers' Qwen2-VL image processor (its PIL backend), built from the model
   directory's preprocessor_config.json: pixel_values [num_patches, C * T * P * P] and image_grid_thw [n, 3].
The grids need only each image's size, so a dataset is checked and tokenised without its pixels, which are made
again per batch (`VisionProcessor.pixels`).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import torch

from rlhf_mcore.data.images import IMAGE_PLACEHOLDER

PROCESSOR_FILE = "preprocessor_config.json"
DEFAULT_IDS = {"image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653}


@dataclasses.dataclass(frozen=True)
class VisionTokens:
    """The token ids of config.json (transformers' defaults where it has none)."""

    image: int
    start: int
    end: int

    @classmethod
    def from_hf_config(cls, hf: dict) -> "VisionTokens":
        ids = {k: hf.get(k, v) for k, v in DEFAULT_IDS.items()}
        return cls(ids["image_token_id"], ids["vision_start_token_id"], ids["vision_end_token_id"])


def expand_image_tokens(ids: Sequence[int], image_id: int, counts: Sequence[int]) -> list[int]:
    """ids with the k-th `image_id` repeated counts[k] times.

    >>> expand_image_tokens([5, 9, 6, 9], 9, [2, 3])
    [5, 9, 9, 6, 9, 9, 9]
    """
    out, k = [], 0
    for i in ids:
        if i == image_id:
            out += [i] * counts[k]
            k += 1
        else:
            out.append(i)
    return out


class VisionProcessor:
    """transformers' Qwen2-VL image processor and the model's vision tokens (`VisionTokens`)."""

    def __init__(self, image_processor, tokens: VisionTokens):
        self.image_processor = image_processor
        self.tokens = tokens
        self.patch = image_processor.patch_size
        self.merge = image_processor.merge_size
        self.temporal = image_processor.temporal_patch_size

    @classmethod
    def from_hf_dir(cls, path: str | Path, hf: dict) -> "VisionProcessor":
        """From `path/preprocessor_config.json` (a Qwen2.5-VL directory has one) and config.json's token ids."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        file = Path(path) / PROCESSOR_FILE
        if not file.is_file():
            raise ValueError(f"model.hf_path: {file} not found: a vision model needs its image processor's "
                             f"settings (got {path}). Use the model's full HF directory.")
        settings = {k: v for k, v in json.loads(file.read_text()).items()
                    if k not in ("image_processor_type", "processor_class")}
        return cls(Qwen2VLImageProcessorPil(**settings), VisionTokens.from_hf_config(hf))

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """(t, h, w) patch grid of an image of that size after the processor's resize."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size = self.image_processor.size
        h, w = smart_resize(height, width, factor=self.patch * self.merge, min_pixels=size["shortest_edge"],
                            max_pixels=size["longest_edge"])
        return (1, h // self.patch, w // self.patch)

    def token_count(self, grid: tuple[int, int, int]) -> int:
        return grid[0] * grid[1] * grid[2] // (self.merge * self.merge)

    def pixels(self, images: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values [num_patches, C*T*P*P] fp32, image_grid_thw [n, 3] long) of PIL images."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        return out["pixel_values"].float(), out["image_grid_thw"].long()

    def marker(self, tokenizer) -> str:
        """The text of an image in the chat template: `<|vision_start|><|image_pad|><|vision_end|>`."""
        text = lambda i: tokenizer.decode([i], skip_special_tokens=False)  # noqa: E731
        return "".join(text(i) for i in (self.tokens.start, self.tokens.image, self.tokens.end))

    def prompt_ids(self, tokenizer, messages: Sequence[dict], images: list, render) -> tuple[list[int], tuple]:
        """(ids with the image tokens expanded, the images' grids). `render(tokenizer, messages) -> ids` is the
        text path's tokenisation (`dataset.tokenize_prompt`); `images`: PIL images, one per `<image>`."""
        marker = self.marker(tokenizer)
        filled = [{**m, "content": m["content"].replace(IMAGE_PLACEHOLDER, marker)} for m in messages]
        ids = render(tokenizer, filled)
        found = sum(1 for i in ids if i == self.tokens.image)
        if found != len(images):
            raise ValueError(f"the tokenizer turned {len(images)} image(s) into {found} image token(s) "
                             f"(id {self.tokens.image}, text {marker!r}). Use the vision model's own tokenizer.")
        grids = tuple(self.grid(*img.size) for img in images)
        return expand_image_tokens(ids, self.tokens.image, [self.token_count(g) for g in grids]), grids


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
