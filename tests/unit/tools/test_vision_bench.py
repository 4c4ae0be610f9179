"""tools/bench/vision_bench.py (bench_grpo_step.py --images): the tower's FLOPs are torch's count of transformers'
eager tower, the prompts' image tokens are what the image processor makes of the images, and the bench's --tiny run
with images (the GPU command's code path, tools/gpu/gpu_vlm.sh) trains on them and counts the tower."""
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rlhf_mcore.data.images import open_images
from rlhf_mcore.data.vision_prompt import PromptPixels, VisionProcessor
from rlhf_mcore.models.vision import build_vision_tower
from tests.support.paths import ROOT
from tools.bench import vision_bench
from tools.bench.bench_grpo_step import main

TINY = json.loads((ROOT / "data" / "tiny_vlm" / "config.json").read_text())
TINY3 = json.loads((ROOT / "data" / "tiny_vlm3" / "config.json").read_text())  # Qwen3-VL: patch 16, DeepStack


@pytest.mark.parametrize("hf", [TINY, TINY3], ids=["qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("grid", [(1, 4, 4), (1, 8, 8), (1, 12, 8)])
def test_tower_flops_are_torchs_count_of_the_eager_tower(grid, hf):
    tower = build_vision_tower(hf, torch.float32, "cpu", attention="eager")
    patch = hf["vision_config"]["patch_size"]
    patches = torch.randn(grid[0] * grid[1] * grid[2], 3 * 2 * patch * patch)
    with FlopCounterMode(display=False) as counter:
        tower(patches, grid_thw=torch.tensor([grid]))
    assert vision_bench.tower_flops_per_image(hf["vision_config"], grid) == counter.get_total_flops()


@pytest.mark.parametrize("name, tokens", [("qwen2.5-vl-3b", 256), ("qwen3-vl-4b", 196), ("qwen3-vl-30b-a3b-4l", 196)])
def test_prompts_carry_the_image_tokens_the_processor_makes(tmp_path, name, tokens):
    hf = vision_bench.SHAPES[name]
    processor = VisionProcessor.from_hf_dir(vision_bench.write_vlm_dir(tmp_path, hf, 448), hf)
    prompts = vision_bench.ImagePrompts(3, 600, hf, images=2, side=448)
    rows, later = prompts.next_batch(), prompts.next_batch()
    every = [im for row in rows + later for im in row.images]
    assert len(set(every)) == len(every) == 12  # new images every step and slot: SGLang's tower cache never hits
    t = processor.tokens
    for row in rows:
        images = open_images(row.images, "bench")
        grids = [processor.grid(*im.size) for im in images]
        assert len(row.prompt_ids) == 600
        assert row.prompt_ids.count(t.image) == sum(processor.token_count(g) for g in grids) == 2 * tokens
        assert row.prompt_ids.count(t.start) == row.prompt_ids.count(t.end) == 2
        assert max(i for i in row.prompt_ids if i not in (t.image, t.start, t.end)) < vision_bench.TEXT_IDS_BELOW
    pixels, grid_thw = PromptPixels(processor)(rows[:1])[0]
    side = 448 // hf["vision_config"]["patch_size"]  # 32 patches of 14, 28 of 16
    assert grid_thw.tolist() == [[1, side, side]] * 2 and pixels.shape[0] == 2 * side * side
    with pytest.raises(ValueError, match="--prompt-len"):
        vision_bench.ImagePrompts(1, tokens + 2, hf, images=1, side=448)  # no room left for text


def test_tiny_bench_with_images_counts_the_tower(tmp_path, mcore_ctx):
    hf_dir = vision_bench.write_vlm_dir(tmp_path / "hf", TINY, 56)
    main(["--tiny", "--hf-path", str(hf_dir), "--images", "1", "--image-side", "56", "--cuda-graphs", "0",
          "--mini-batches", "2", "--steps", "1", "--warmup", "0", "--standalone", "0", "--out", str(tmp_path)])
    result = json.loads(next(tmp_path.glob("grpo_step_part_*.json")).read_text())
    per_image = vision_bench.tower_flops_per_image(TINY["vision_config"], (1, 4, 4))
    prompts = result["shape"]["prompts"]  # the tower runs once per prompt (its n samples share the embeddings)
    forward = sum(result["phases_s"][p] > 0.05 for p in ("old_log_prob", "ref"))  # the passes the LM's MFU counts
    assert result["tower_tflop_per_step"] * 1e12 == pytest.approx(prompts * per_image * (forward + 1))  # frozen: fwd
    assert result["mismatch"]["rollout/mismatch_logp_abs_diff"] < 1e-5  # fp32: the rollout is the trainer
    update = next(r for r in result["memory_plan"] if r["phase"] == "update")
    tower = build_vision_tower(TINY, torch.float32, "cpu")
    assert update["terms_gib"]["tower"] * 2**30 == pytest.approx(sum(4 * p.numel() for p in tower.parameters()))
