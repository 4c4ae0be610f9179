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


class PromptPixels:
    """prompts (PromptRow) -> per prompt (pixel_values [p, D], image_grid_thw [i, 3]) or None (no images): the
    images opened and processed again per batch (a dataset holds their bytes or paths, not their pixels), the
    last `cache_size` prompts' kept."""

    def __init__(self, processor: VisionProcessor, cache_size: int = 1024):
        self.processor, self.cache_size, self.cache = processor, cache_size, {}

    def __call__(self, prompts: Sequence) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        from rlhf_mcore.data.images import open_images

        out = []
        for p in prompts:
            if not p.images:
                out.append(None)
                continue
            if p.images not in self.cache:
                if len(self.cache) >= self.cache_size:
                    self.cache.pop(next(iter(self.cache)))
                self.cache[p.images] = self.processor.pixels(open_images(p.images, f"prompt row {p.index}"))
            out.append(self.cache[p.images])
        return out
