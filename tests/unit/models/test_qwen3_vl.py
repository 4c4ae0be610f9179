"""Qwen3-VL (models/families/qwen3_vl.py, models/vision.py): a tiny random HF `Qwen3VLForConditionalGeneration`
loaded from its directory gives transformers' logits with images (fp32, TP1, within 1e-5); without its DeepStack
hooks it would not (the negative control); megatron's rotary table with the encoded section list is transformers'
interleaved one; the checkpoint's tensor names load; what is not supported is refused, one line each."""
import json

import pytest
import torch

from tests.support.tiny_vl import (
    IMAGE,
    PATCH_DIM3,
    image_batch,
    logits_error,
    our_logits,
    save_tiny_family,
    tiny_vl3_model,
    vision_lm_tp1,
)


@pytest.fixture(scope="module")
def vl3_dir(tmp_path_factory):
    return save_tiny_family("qwen3_vl", tmp_path_factory.mktemp("qwen3_vl") / "hf")


@pytest.fixture(scope="module")
def ours(vl3_dir, mcore_ctx):
    return vision_lm_tp1(vl3_dir, mcore_ctx)


def batch3():
    return image_batch(patch_dim=PATCH_DIM3)


def test_logits_match_transformers_with_images_at_tp1(vl3_dir, ours, mcore_ctx):
    batch = batch3()
    err, got, want = logits_error(vl3_dir, ours, batch, mcore_ctx.pgs.tp)
    valid = batch["attention_mask"].bool()
    print(f"qwen3-vl tp1 logits max |ours - transformers| = {err:.2e} over {int(valid.sum())} tokens")
    assert err <= 1e-5
    assert len(ours.lm.vision.hooks) == 2  # DeepStack levels from blocks 0 and 2 into LM layers 0 and 1
    # the negative control: without DeepStack's additions the image tokens' logits (and what follows) move
    hooks = ours.lm.vision.hooks
    for h in hooks:
        h.remove()
    try:
        off = our_logits(ours, batch, mcore_ctx.pgs.tp)
    finally:
        from rlhf_mcore.models.hf_io import read_hf_config
        from rlhf_mcore.models.vision import attach_tower

        attach_tower(ours.lm, ours.tower, read_hf_config(vl3_dir), trainable=False)
    assert (want - off).abs()[valid].max().item() > 1e-2
    assert torch.equal(our_logits(ours, batch, mcore_ctx.pgs.tp), got)  # hooks back: the same logits


def test_megatron_rotary_table_is_transformers_interleaved(ours):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from rlhf_mcore.models.mrope import mrope_position_ids

    hf_rope = Qwen3VLTextRotaryEmbedding(tiny_vl3_model().config.text_config)
    batch = batch3()
    pos, _ = mrope_position_ids(batch["input_ids"], batch["image_grid_thw"], IMAGE, 2, batch["attention_mask"])
    cos, sin = hf_rope(torch.zeros(1, dtype=torch.float32), pos)  # [B, S, head_dim]
    emb = ours.lm.rotary_pos_emb(pos, ours.lm.mrope_section)[:, :, 0].transpose(0, 1)
    assert torch.equal(emb.cos(), cos) and torch.equal(emb.sin(), sin)
    assert ours.lm.mrope_section == [1] * 8 + [0]  # [3, 3, 2] interleaved: t h w t h w t h, one frequency a chunk


def test_unsupported_settings_are_refused_one_line_each(vl3_dir):
    from rlhf_mcore.config import load_config
    from rlhf_mcore.models.families import qwen3_vl

    hf = json.loads((vl3_dir / "config.json").read_text())
    flat = qwen3_vl.text_config(hf)
    qwen3_vl.check(flat, "config.json")  # the tiny model's own config passes
    bad = {**flat, "attention_bias": True,
           "rope_parameters": {**flat["rope_parameters"], "mrope_interleaved": False, "mrope_section": [3, 3, 3]}}
    with pytest.raises(ValueError) as err:
        qwen3_vl.check(bad, "config.json")
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and all(line.startswith("config.json: ") for line in lines)
    assert "mrope_section" in lines[0] and "mrope_interleaved" in lines[1] and "attention_bias" in lines[2]
    cfg = load_config(None, [f"model.hf_path={vl3_dir}", "parallel.pp=2", "model.recompute=full",
                             "parallel.sequence_parallel=true", "parallel.tp=2"], check=False)
    errs = qwen3_vl.run_errors(cfg)
    assert any(e.startswith("model.recompute: full recompute with Qwen3-VL") for e in errs)
    assert any(e.startswith("parallel.sequence_parallel: not yet with Qwen3-VL") for e in errs)


def test_deepstack_layers_off_the_first_pipeline_stage_are_refused(vl3_dir, ours):
    """A later stage holding LM layer 0 or 1 (the tiny model's DeepStack layers) would never see the features: one
    line, before any forward."""
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.vision import attach_tower

    layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(2))  # a second stage's layers 0 and 1 (pp = 2
    for number, layer in enumerate(layers, start=1):                       # of a model whose first stage is empty)
        layer.layer_number = number
    later = torch.nn.Module()
    later.decoder, later.pre_process = torch.nn.Module(), False
    later.decoder.layers = layers
    with pytest.raises(ValueError, match=r"^parallel.pp: DeepStack adds .* layers 0..1, .*got layer 0 on a later"):
        attach_tower(later, ours.tower, read_hf_config(vl3_dir), trainable=False)


def test_a_pipeline_split_that_moves_a_deepstack_layer_is_refused_at_validation():
    """The shipped tiny preset (2 LM layers, 2 DeepStack levels) cannot run at pp=2: one config error naming the
    key, the value and the fix, before any process builds a model; pp=1 passes."""
    from rlhf_mcore.config import load_config
    from rlhf_mcore.config.validate import validate
    from tests.support.paths import CONFIGS

    errs = validate(load_config(str(CONFIGS / "tiny_vlm3_grpo.yaml"), ["parallel.pp=2"], check=False), 2)
    lines = [e for e in errs if "DeepStack" in e]
    assert lines == ["parallel.pp: Qwen3-VL's DeepStack adds to LM layers 0..1, which must all sit on the first "
                     "pipeline stage (got 1 layer(s) a stage at parallel.pp=2). Use parallel.pp <= 1."], errs
    assert not [e for e in validate(load_config(str(CONFIGS / "tiny_vlm3_grpo.yaml"), [], check=False), 1)
                if "DeepStack" in e]
