"""A tiny random Qwen2.5-VL (transformers' `Qwen2_5_VLForConditionalGeneration`) and a batch of images for it.

LM: 2 layers, hidden 64, 4 heads / 2 KV heads (head_dim 16, M-RoPE sections 2 + 3 + 3 = 8), vocab 300.
Vision: depth 2 (block 0 windowed, block 1 full attention), hidden 32, patch 14, temporal patch 2, merge 2, out 64.
A 56x56 image is a 4x4 patch grid -> 4 LM tokens; a 56x84 one 4x6 -> 6 tokens (height and width positions differ).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tests.support.tiny_hf import randomize_

VOCAB, IMAGE, VIDEO, START, END = 300, 290, 291, 288, 289
GRIDS = ((1, 4, 4), (1, 4, 6))  # (t, h, w) patch grids of the two images
PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


def tiny_vl_model(seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, rms_norm_eps=1e-6,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=56, out_hidden_size=64,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    model = Qwen2_5_VLForConditionalGeneration(config)
    randomize_(model, seed)
    return model.eval()


PATCH_DIM3 = 3 * 2 * 16 * 16  # Qwen3-VL's patch: 16 x 16


def tiny_vl3_model(seed: int = 0):
    """A tiny random Qwen3-VL (transformers' `Qwen3VLForConditionalGeneration`): LM 4 layers, hidden 64, 4 heads /
    2 KV heads, head_dim 16, interleaved M-RoPE sections 3 + 3 + 2 (unequal, so a contiguous layout would differ on
    image tokens), untied; tower depth 3, hidden 32, patch 16, merge 2, an 8 x 8 position table (4 x 4 and 4 x 6
    grids interpolate), DeepStack from blocks 0 and 2 into LM layers 0 and 1."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=512,
                         rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                                          "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                           num_position_embeddings=64, deepstack_visual_indexes=[0, 2]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
        tie_word_embeddings=False)
    model = Qwen3VLForConditionalGeneration(config)
    randomize_(model, seed)
    return model.eval()


def tiny_vl3_moe_model(seed: int = 0):
    """A tiny random Qwen3-VL-MoE (transformers' `Qwen3VLMoeForConditionalGeneration`): `tiny_vl3_model`'s tower,
    rotary and DeepStack around 4 MoE layers of 4 experts, top-2, each expert 48 wide (hidden 64: neither 2 x 48 nor
    48 equals it, so a fused tensor's two layouts differ in shape, as the real models' do)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    dense = tiny_vl3_model(seed).config.to_dict()
    text = {k: v for k, v in dense["text_config"].items() if k not in ("model_type", "dtype", "architectures")}
    vision = {k: v for k, v in dense["vision_config"].items() if k not in ("model_type", "dtype")}
    config = Qwen3VLMoeConfig(text_config={**text, "num_experts": 4, "num_experts_per_tok": 2,
                                           "moe_intermediate_size": 48, "decoder_sparse_step": 1},
                              vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                              vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False)
    model = Qwen3VLMoeForConditionalGeneration(config)
    randomize_(model, seed)
    return model.eval()


# the tiny model of each vision family and its patch size (a row of pixel_values)
FAMILIES = {"qwen2_5_vl": (tiny_vl_model, PATCH_DIM), "qwen3_vl": (tiny_vl3_model, PATCH_DIM3),
            "qwen3_vl_moe": (tiny_vl3_moe_model, PATCH_DIM3)}


def family_in(vl_dir) -> str:
    """The family of a saved tiny directory (its config.json's model_type: a key of `FAMILIES`)."""
    from rlhf_mcore.models.hf_io import read_hf_config

    return read_hf_config(vl_dir)["model_type"]


def save_tiny_family(family: str, out_dir: Path, hub_layout: bool = True) -> Path:
    """transformers' `save_pretrained` of the family's tiny model. Fused experts (Qwen3-VL-MoE) are then stored in the
    Hub's layout ([E, H, 2I], [E, I, H]: transposed from what transformers 5 writes) unless not `hub_layout`."""
    from safetensors.torch import load_file, save_file

    FAMILIES[family][0]().save_pretrained(str(out_dir))
    path = Path(out_dir) / "model.safetensors"
    tensors = load_file(str(path))
    fused = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    if hub_layout and fused:
        save_file({k: v.transpose(1, 2).contiguous() if k in fused else v for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
    return Path(out_dir)


def image_batch(seed: int = 0, patch_dim: int = PATCH_DIM) -> dict:
    """Three right-padded rows: one image each in rows 0 and 1 (4 and 6 tokens), row 2 text only and shorter.
    input_ids / attention_mask [3, 16], pixel_values [40, patch_dim], image_grid_thw [2, 3], mm_token_type_ids."""
    gen = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(3, START, (n,), generator=gen).tolist()  # noqa: E731
    rows = [text(3) + [START] + [IMAGE] * 4 + [END] + text(5),
            text(2) + [START] + [IMAGE] * 6 + [END] + text(6),
            text(9)]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    patches = sum(t * h * w for t, h, w in GRIDS)
    return {"input_ids": input_ids, "attention_mask": mask, "image_grid_thw": torch.tensor(GRIDS),
            "pixel_values": torch.randn(patches, patch_dim, generator=gen),
            "mm_token_type_ids": (input_ids == IMAGE).int()}


def vl_actor(vl_dir, mcore_ctx, freeze: bool = True):
    """(config, TrainState) of the actor of a tiny VL directory at the context's TP and PP, its tower frozen unless
    not `freeze`."""
    from rlhf_mcore.config import load_config
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.hf_load import load_hf_weights
    from rlhf_mcore.trainer.optim import build_train_state
    from rlhf_mcore.trainer.roles import attach_run_tower

    cfg = load_config(None, [f"model.hf_path={vl_dir}", "model.attention_backend=sdpa",
                             f"parallel.tp={mcore_ctx.dims.tp}", f"parallel.pp={mcore_ctx.dims.pp}",
                             f"parallel.ep={mcore_ctx.dims.ep}",
                             f"model.freeze_vision_tower={str(freeze).lower()}",
                             "trainer.export_hf=false"],
                      check=False)
    hf = read_hf_config(vl_dir)
    model = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    load_hf_weights(model, str(vl_dir), hf, mcore_ctx.tp_rank, mcore_ctx.dims.tp)
    attach_run_tower(model, cfg, hf, mcore_ctx)
    return cfg, build_train_state(model, cfg.actor.optim, cfg.parallel)


def vl_step_batch(seed: int = 0, patch_dim: int = PATCH_DIM) -> dict:
    """tests/support/tiny_vl.py's image batch as a step batch: rows 0 and 1 have an image each, row 2 none."""
    from rlhf_mcore.models.vision_step import stack_row_images

    b = image_batch(seed, patch_dim)
    lengths = b["attention_mask"].sum(1)
    pos = torch.arange(b["input_ids"].size(1))[None]
    patches = [t * h * w for t, h, w in GRIDS]
    per_row = [(b["pixel_values"][:patches[0]], torch.tensor([GRIDS[0]])),
               (b["pixel_values"][patches[0]:], torch.tensor([GRIDS[1]])), None]
    g = torch.Generator().manual_seed(seed)
    mask = ((pos >= 1) & (pos < lengths[:, None])).float()
    return {"tokens": b["input_ids"], "lengths": lengths, "prompt_lengths": lengths, "response_mask": mask,
            "advantages": torch.randn(mask.shape, generator=g), "rollout_logp": torch.zeros(mask.shape),
            **stack_row_images(per_row, b["pixel_values"].size(1), "cpu")}


def hf_param_count(hf: dict) -> int:
    """The parameters of transformers' whole vision LM (Qwen2.5-VL, Qwen3-VL, -MoE) of config.json dict `hf` (built on
    the meta device)."""
    import transformers

    classes = {"qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
               "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
               "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration")}
    config_cls, model_cls = classes[hf["model_type"]]
    config = getattr(transformers, config_cls)(**{k: v for k, v in hf.items() if k not in ("architectures",
                                                                                            "model_type")})
    with torch.device("meta"):
        return sum(p.numel() for p in getattr(transformers, model_cls)(config).parameters())


def our_logits(vlm, batch, tp_group) -> torch.Tensor:
    """Logits [B, S, V] of a `models.vision.VisionLM` on an image batch (`image_batch`), gathered over TP."""
    from rlhf_mcore.models.logprobs import full_logits
    from rlhf_mcore.models.vision import vision_lm_forward

    with torch.no_grad():
        hidden = vision_lm_forward(vlm, batch["input_ids"], batch["pixel_values"], batch["image_grid_thw"],
                                   batch["attention_mask"])
        return full_logits(vlm.lm, hidden, tp_group)


def logits_error(vl_dir, vlm, batch, tp_group) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(max |ours - transformers| over the batch's tokens, ours, transformers') for the model saved in `vl_dir`."""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(str(vl_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(**batch).logits
    got = our_logits(vlm, batch, tp_group)
    assert got.shape == want.shape
    return (want - got).abs()[batch["attention_mask"].bool()].max().item(), got, want


def vision_lm_tp1(vl_dir, mcore_ctx):
    """The `models.vision.VisionLM` of a tiny directory at TP1 / PP1, fp32, SDPA."""
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.vision import build_vision_lm

    return build_vision_lm(str(vl_dir), "actor", ModelConfig(dtype="fp32", attention_backend="sdpa"),
                           ParallelConfig(tp=1, pp=1), mcore_ctx)


def mixed_size_shapes(out_dir: Path) -> Path:
    """data/shapes with its images at three sizes (rows 8k: 84 x 84, 8k+1..8k+3: 56 x 112, the rest 56 x 56: 36, 32
    and 16 patches, 9, 8 and 4 image tokens), and data/tiny_vlm whose image processor keeps those sizes (max_pixels
    12544; the shipped one resizes every image to 56 x 56): a batch of 8 prompts lacks the largest a third of the time,
    so rounds and DP ranks hold images of different widths. Writes out_dir/{train,test}.parquet and out_dir/tiny_vlm."""
    import io
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from tests.support.paths import ROOT

    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = ((84, 84),) + ((56, 112),) * 3 + ((56, 56),) * 4
    for split in ("train", "test"):
        rows = pq.read_table(ROOT / "data" / "shapes" / f"{split}.parquet").to_pylist()
        for i, row in enumerate(rows):
            images = []
            for image in row["images"]:
                buf = io.BytesIO()
                Image.open(io.BytesIO(image["bytes"])).resize(sizes[i % 8]).save(buf, format="PNG")
                images.append({"bytes": buf.getvalue(), "path": None})
            row["images"] = images
        pq.write_table(pa.Table.from_pylist(rows), out_dir / f"{split}.parquet")
    model = out_dir / "tiny_vlm"
    shutil.copytree(ROOT / "data" / "tiny_vlm", model, dirs_exist_ok=True)
    processor = json.loads((model / "preprocessor_config.json").read_text())
    processor.update(max_pixels=12544, size={"shortest_edge": 3136, "longest_edge": 12544})
    (model / "preprocessor_config.json").write_text(json.dumps(processor))
    return out_dir
