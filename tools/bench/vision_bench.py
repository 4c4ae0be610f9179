"""The vision-language side of tools/bench/bench_grpo_step.py (`--images N`, issue 43): a Qwen2.5-VL, Qwen3-VL or
Qwen3-VL-MoE directory (config.json + preprocessor_config.json, no weights: model.init=random), prompts carrying N
synthetic images of a fixed size, the tower's FLOPs for MFU, and the tower drawn on the GPU under --gpu-init.

    python -m tools.bench.bench_grpo_step --hf-path DIR --images 1 --image-side 448 ...   # DIR: write_vlm_dir

A prompt is N x (<|vision_start|> <|image_pad|> x tokens <|vision_end|>) then random text up to --prompt-len
tokens; its images are random-noise PNGs drawn once per prompt slot (seeded by the slot), so the per-batch image
processing (`data.vision_prompt.PromptPixels`, cached by the images' bytes) runs in the warm-up step only and the
timed steps measure the model.
"""
from __future__ import annotations

import contextlib
import io
import json
import types
from pathlib import Path

import torch

from rlhf_mcore.data.vision_prompt import PROCESSOR_FILE, VisionTokens

# Qwen2.5-VL-3B-Instruct's architecture (its config.json, in transformers' Qwen2_5_VLConfig field names)
QWEN25_VL_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": True,
    "text_config": {"model_type": "qwen2_5_vl_text", "num_hidden_layers": 36, "hidden_size": 2048,
                    "intermediate_size": 11008, "num_attention_heads": 16, "num_key_value_heads": 2,
                    "vocab_size": 151936, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
                    "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 151643,
                    "eos_token_id": 151645,
                    "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24],
                                        "rope_theta": 1000000.0}},
    "vision_config": {"model_type": "qwen2_5_vl_vision", "depth": 32, "hidden_size": 1280,
                      "intermediate_size": 3420, "num_heads": 16, "in_channels": 3, "out_hidden_size": 2048,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu", "tokens_per_second": 2},
}
# Qwen3-VL-4B-Instruct's architecture as docs/qwen3_vl_research.md records it (LM 36 x 2560, tower 24 x 1024 with
# DeepStack from blocks 5, 11, 17, patch 16; tied embeddings)
QWEN3_VL_4B = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": True,
    "text_config": {"model_type": "qwen3_vl_text", "num_hidden_layers": 36, "hidden_size": 2560,
                    "intermediate_size": 9728, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 151936, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                    "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 151643,
                    "eos_token_id": 151645,
                    "rope_parameters": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True, "rope_theta": 5000000.0}},
    "vision_config": {"model_type": "qwen3_vl_vision", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                      "num_heads": 16, "in_channels": 3, "out_hidden_size": 2560, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
                      "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh"},
}
# Qwen3-VL-30B-A3B's layers (docs/qwen3_vl_research.md: LM hidden 2048, 128 experts top-8 of 768, 32 heads / 4 KV;
# tower 27 x 1152 with DeepStack from blocks 8, 16, 24, out 2048; untied), cut to 4 LM layers to train on one GPU
# (DeepStack adds into LM layers 0-2): 3.6 B parameters, the experts 2.4 B of them
QWEN3_VL_30B_A3B_4L = {
    **QWEN3_VL_4B, "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    "tie_word_embeddings": False,
    "text_config": {**QWEN3_VL_4B["text_config"], "model_type": "qwen3_vl_moe_text", "num_hidden_layers": 4,
                    "hidden_size": 2048, "intermediate_size": 6144, "num_key_value_heads": 4,
                    "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
                    "moe_intermediate_size": 768, "decoder_sparse_step": 1},
    "vision_config": {**QWEN3_VL_4B["vision_config"], "model_type": "qwen3_vl_moe_vision", "depth": 27,
                      "hidden_size": 1152, "intermediate_size": 4304, "out_hidden_size": 2048,
                      "deepstack_visual_indexes": [8, 16, 24]},
}
SHAPES = {"qwen2.5-vl-3b": QWEN25_VL_3B, "qwen3-vl-4b": QWEN3_VL_4B,  # tools/gpu/gpu_vlm.sh SHAPE=
          "qwen3-vl-30b-a3b-4l": QWEN3_VL_30B_A3B_4L}
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
TEXT_IDS_BELOW = 151643  # random text ids stay under Qwen's special tokens (no stray image or vision id)


def processor_settings(side: int, patch: int = 14) -> dict:
    """preprocessor_config.json of transformers' Qwen2-VL image processor resizing every image to side x side."""
    return {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": patch, "merge_size": 2,
            "temporal_patch_size": 2, "min_pixels": side * side, "max_pixels": side * side,
            "size": {"shortest_edge": side * side, "longest_edge": side * side}, "image_mean": MEAN,
            "image_std": STD}


def write_vlm_dir(out: str | Path, hf: dict, side: int) -> Path:
    """`out` with config.json (`hf`) and preprocessor_config.json (`processor_settings(side)`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    settings = processor_settings(side, hf["vision_config"]["patch_size"])
    (out / PROCESSOR_FILE).write_text(json.dumps(settings, indent=1))
    return out


def image_tokens(side: int, patch: int = 14, merge: int = 2) -> int:
    """LM tokens of one side x side image: (side / patch)^2 patches merged merge x merge.

    >>> image_tokens(448)
    256
    """
    return (side // patch) ** 2 // (merge * merge)


def noise_png(side: int, seed: int) -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (side, side, 3), generator=g, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=0)  # noise does not compress: only time
    return buf.getvalue()


class ImagePrompts:
    """The bench's sampler for a vision LM: `num` prompts of `length` tokens a step, each with `images` noise
    images of side x side (`image_tokens(side)` LM tokens each) then random text. The images are new each step, as
    a dataset's are: SGLang caches tower outputs by image hash, and repeated images skip its tower (on the H200 that
    hid a tower left with released weights)."""

    def __init__(self, num: int, length: int, hf: dict, images: int, side: int, dp_rank: int = 0):
        self.num, self.length, self.images, self.side, self.dp_rank, self.step = num, length, images, side, dp_rank, 0
        self.tokens = t = VisionTokens.from_hf_config(hf)
        self.below = min(TEXT_IDS_BELOW, t.start, t.image, t.end, hf["text_config"]["vocab_size"])
        self.patch = hf["vision_config"]["patch_size"]
        self.per_image = image_tokens(side, self.patch)
        self.text = length - images * (self.per_image + 2)
        if self.text < 1:
            raise ValueError(f"--prompt-len: {length} tokens do not hold {images} image(s) of {self.per_image + 2} "
                             f"tokens and some text. Raise --prompt-len or lower --image-side.")

    def pngs(self, slot: int) -> tuple[bytes, ...]:
        first = 7919 * (slot + self.num * self.dp_rank) + 104729 * self.step
        return tuple(noise_png(self.side, first + k) for k in range(self.images))

    def next_batch(self):
        g = torch.Generator().manual_seed(self.step + 1000 * self.dp_rank)
        t = self.tokens
        image = [t.start] + [t.image] * self.per_image + [t.end]
        rows, grid = [], (1, self.side // self.patch, self.side // self.patch)
        for slot in range(self.num):
            text = torch.randint(10, self.below, (self.text,), generator=g).tolist()
            rows.append(types.SimpleNamespace(prompt_ids=image * self.images + text, images=self.pngs(slot),
                                              index=slot, image_grid_thw=(grid,)))
        self.step += 1
        return rows


def tower_flops_per_image(vision: dict, grid: tuple[int, int, int]) -> float:
    """Forward FLOPs of transformers' tower + merger on one image of patch grid (t, h, w): the patch embedding, per
    block q/k/v/o (4 d^2) and the MLP (Qwen2.5-VL's gated: 3 d i; Qwen3-VL's plain: 2 d i), 2 FLOPs a weight and
    patch, attention's QK^T and AV over the block's context (Qwen2.5-VL: a window of (window / patch)^2 patches,
    the whole image in `fullatt_block_indexes`; Qwen3-VL: the whole image), and the merger's two layers per merged
    token (Qwen3-VL: once more per DeepStack level). Exact (torch's FlopCounterMode on the eager tower) where the
    windows tile the grid; the norms, softmax and Qwen3-VL's position interpolation are not counted.

    >>> v = {"depth": 2, "hidden_size": 4, "intermediate_size": 8, "patch_size": 2, "temporal_patch_size": 1,
    ...      "in_channels": 1, "spatial_merge_size": 2, "window_size": 2, "out_hidden_size": 3,
    ...      "fullatt_block_indexes": [1]}
    >>> tower_flops_per_image(v, (1, 4, 4))  # embed 512 + blocks 2 x 5120 + attention 256 + 4096 + merger 2432
    17536.0
    """
    d, inter, merge = vision["hidden_size"], vision["intermediate_size"], vision["spatial_merge_size"]
    patches = grid[0] * grid[1] * grid[2]
    patch_in = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    windowed = "window_size" in vision  # Qwen2.5-VL; Qwen3-VL attends over the whole image in every block
    window = min(patches, (vision["window_size"] // vision["patch_size"]) ** 2) if windowed else patches
    full = set(vision.get("fullatt_block_indexes", ()))
    mlp = 3 if windowed else 2  # gated SiLU, or fc1 -> GELU -> fc2
    flops = 2 * patches * patch_in * d
    for block in range(vision["depth"]):
        context = patches if block in full else window
        flops += 2 * patches * (4 * d * d + mlp * d * inter) + 2 * 2 * patches * context * d
    wide = d * merge * merge
    mergers = 1 + len(vision.get("deepstack_visual_indexes") or ())
    flops += mergers * 2 * (patches // (merge * merge)) * (wide * wide + wide * vision["out_hidden_size"])
    return float(flops)


def tower_step_flops(hf: dict, prompts: int, images: int, side: int, lm_passes: float, trained: bool) -> float:
    """The tower's FLOPs of a step's trainer passes: once per prompt and image (the n samples of a prompt share its
    embeddings: `models.vision_step.shared_image_embeddings`; the bench's micro-batches hold whole groups) in each
    forward pass (old log-prob, reference: `lm_passes - 3` of them) and in the update (x3 when trained, else
    forward only)."""
    grid = (1, side // hf["vision_config"]["patch_size"], side // hf["vision_config"]["patch_size"])
    per_prompt = images * tower_flops_per_image(hf["vision_config"], grid)
    return prompts * per_prompt * (lm_passes - 3 + (3 if trained else 1))


@contextlib.contextmanager
def tower_on_gpu(enabled: bool):
    """The tower built and drawn on the GPU in bf16 (`models.vision.build_vision_tower`), as --gpu-init draws the
    LM: seconds instead of a CPU init of ~670M parameters."""
    import rlhf_mcore.models.vision as vision

    if not (enabled and torch.cuda.is_available()):
        yield
        return
    original = vision.build_vision_tower

    def on_gpu(hf, dtype, device, *a, **k):
        with torch.device("cuda"):
            return original(hf, torch.bfloat16, "cuda", *a, **k)
    vision.build_vision_tower = on_gpu
    try:
        yield
    finally:
        vision.build_vision_tower = original
