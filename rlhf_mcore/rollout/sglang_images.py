"""A vision LM's prompts through the embedded SGLang engine (Qwen2.5-VL): what the engine is started from and what
each request carries.

- Requests keep our ids as they are: the prompt's image tokens are already expanded (one `<|image_pad|>` per merged
  patch), so each row's images go as SGLang's preprocessed form, one dict per request,
  `{"format": "processor_output", "pixel_values": [patches, C*T*P*P], "image_grid_thw": [images, 3], "hash": h}`.
  SGLang then runs its own copy of the tower on those pixels and computes M-RoPE from our ids and grids, the
  positions our trainer uses (`models.mrope`). Raw images would make SGLang re-tokenize the prompt.
- `hash`: one per prompt, from its pixels, computed once for its n rows. SGLang keys its prefix cache (the image
  tokens' pad values) and its tower-output cache on it. A trained tower makes the second stale after each update,
  so the engine then starts with that cache off (`SGLANG_VLM_CACHE_SIZE_MB=0`, `vlm_cache_env`).
- Every weight refresh sends the tower, trained or frozen: the engine's release drops all its weights. The cache had
  hidden this for Qwen2.5-VL on the H200 (its 32 images' outputs fit, computed before the first release); Qwen3-VL's
  larger DeepStack outputs did not fit, and its tower ran on garbage.
- The engine's start directory holds the tower under `visual.*` (the HF names SGLang's loader maps) and the
  tokenizer and `preprocessor_config.json` of model.hf_path: SGLang builds its multimodal processor even with
  `skip_tokenizer_init`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from typing import Iterator, Optional, Sequence

import torch

from rlhf_mcore.models.vision import vision_side

PROCESSOR_FILES = ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.json", "chat_template.jinja", "generation_config.json")
TOWER_PREFIX = "visual."  # SGLang's Qwen2.5-VL loader: model.layers.* / lm_head.* / visual.* (the Hub's names)
VLM_CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"


def images_hash(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> int:
    """A 63-bit content hash of one prompt's images (pixels and grids).

    >>> pv, thw = torch.ones(4, 6), torch.tensor([[1, 2, 2]])
    >>> images_hash(pv, thw) == images_hash(pv.clone(), thw.clone()), images_hash(pv, thw) == images_hash(pv * 2, thw)
    (True, False)
    """
    h = hashlib.blake2b(digest_size=8)
    for t in (pixel_values, image_grid_thw):
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def image_data(row_images: Sequence[Optional[tuple]]) -> Optional[list]:
    """SGLang's `image_data` for a batch of rows (each row: (pixel_values, image_grid_thw) or None); None when no
    row has images. Rows sharing one images object (a prompt's n samples) share its dict and hash.

    >>> prompt = (torch.ones(4, 6), torch.tensor([[1, 2, 2]]))  # one prompt's images, as its n rows hold them
    >>> data = image_data([prompt, None, prompt])
    >>> data[0][0]["format"], data[1], data[0] is data[2], image_data([None, None])
    ('processor_output', None, True, None)
    """
    if all(im is None for im in row_images):
        return None
    made: dict[int, list] = {}
    out = []
    for im in row_images:
        if im is None:
            out.append(None)
            continue
        if id(im) not in made:
            pv, thw = (t.detach().to("cpu") for t in im)
            made[id(im)] = [{"format": "processor_output", "pixel_values": pv, "image_grid_thw": thw,
                             "hash": images_hash(pv, thw)}]
        out.append(made[id(im)])
    return out


def check_continued(prompts: Sequence[list[int]], prompt_lengths: Sequence[int], side) -> None:
    """Refuse a continued sample (multi-turn, partial rollouts) with an image or video id after its prompt, sampled
    or written by a tool in an earlier turn: SGLang would read it as an image slot, where our trainer reads text.

    >>> side = type("Side", (), {"image_token_id": 9, "video_token_id": 8})
    >>> check_continued([[9, 9, 5, 6]], [2], side)
    >>> check_continued([[9, 9, 5, 9]], [2], side)
    Traceback (most recent call last):
    ...
    ValueError: rollout.engine=sglang: sample 0 has an image or video token id at position 3, after its prompt (2 \
tokens), sampled or written by a tool in an earlier turn; SGLang would read it as an image. Use rollout.engine=native.
    """
    special = {side.image_token_id, side.video_token_id}
    for i, (ids, length) in enumerate(zip(prompts, prompt_lengths)):
        found = next((k for k in range(length, len(ids)) if ids[k] in special), None)
        if found is not None:
            raise ValueError(f"rollout.engine=sglang: sample {i} has an image or video token id at position {found}, "
                             f"after its prompt ({length} tokens), sampled or written by a tool in an earlier turn; "
                             "SGLang would read it as an image. Use rollout.engine=native.")


def tower_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The vision tower's tensors under SGLang's (the Hub's) names; nothing for a text model."""
    side = vision_side(model)
    if side is None:
        return iter(())
    return ((TOWER_PREFIX + k, v) for k, v in side.tower.state_dict().items())


def tower_trained(model) -> bool:
    side = vision_side(model)
    return side is not None and any(p.requires_grad for p in side.tower.parameters())


def copy_processor_files(src: str, dst: str) -> list[str]:
    """The tokenizer and image-processor files of model.hf_path that SGLang's multimodal processor loads."""
    copied = []
    for name in PROCESSOR_FILES:
        if src and os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
            copied.append(name)
    if "preprocessor_config.json" not in copied:
        raise ValueError(f"model.hf_path: {src!r} has no preprocessor_config.json, which SGLang needs to take images. "
                         "Point model.hf_path at the model's full HF directory, or set rollout.engine=native.")
    return copied


def engine_config(hf_cfg: dict) -> dict:
    """The config.json SGLang starts from. Its own Qwen3-VL (and Qwen3-VL-MoE) config class reads the Hub's text
    `rope_scaling` and `rope_theta` (transformers 4.57's names; its model asks `"mrope_section" in
    config.rope_scaling` and interleaves only with `mrope_interleaved`), where transformers 5 writes
    `rope_parameters`: those are added from it. Other configs, and a Qwen3-VL one that has them, are unchanged.

    >>> engine_config({"model_type": "qwen3_vl", "text_config": {"rope_parameters": {"rope_type": "default",
    ...     "rope_theta": 5e6, "mrope_section": [24, 20, 20]}}})["text_config"]["rope_scaling"]
    {'rope_type': 'default', 'mrope_section': [24, 20, 20], 'mrope_interleaved': True}
    """
    text = hf_cfg.get("text_config") or {}
    params = text.get("rope_parameters")
    interleaved = hf_cfg.get("model_type") in ("qwen3_vl", "qwen3_vl_moe")
    if not interleaved or text.get("rope_scaling") or not isinstance(params, dict):
        return hf_cfg
    scaling = {k: v for k, v in params.items() if k != "rope_theta"} | {"mrope_interleaved": True}
    theta = {"rope_theta": params["rope_theta"]} if "rope_theta" in params else {}
    return {**hf_cfg, "text_config": {**text, "rope_scaling": scaling, **theta}}


def vision_engine_kwargs() -> dict[str, str]:
    """sglang.Engine arguments of a vision LM: the tower's attention through torch's SDPA. SGLang's default on
    Hopper is FA3 from sgl_kernel, which not every sgl_kernel build ships (the H200 box's raises "Can not import
    FA3 in sgl_kernel" at the first image); SDPA runs everywhere, as the trainer's tower does."""
    return {"mm_attention_backend": "sdpa"}


def vlm_cache_env(model) -> dict[str, str]:
    """The environment SGLang must start with: its tower-output cache off when the tower is trained."""
    return {VLM_CACHE_ENV: "0"} if tower_trained(model) else {}
