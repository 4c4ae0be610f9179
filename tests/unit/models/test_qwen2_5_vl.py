"""Qwen2.5-VL (models/families/qwen2_5_vl.py, models/vision.py, models/mrope.py): a tiny random HF
`Qwen2_5_VLForConditionalGeneration` loaded straight from its directory gives transformers' logits with images
(fp32, TP1, within 1e-5), its M-RoPE positions are transformers' `get_rope_index`, megatron's multimodal rotary
table is transformers' (cos / sin), both checkpoint key layouts load, and what is not supported is refused."""
import json

import pytest
import torch

from rlhf_mcore.models.mrope import mrope_position_ids
from tests.support.tiny_vl import (
    IMAGE,
    VIDEO,
    image_batch,
    logits_error,
    save_tiny_family,
    tiny_vl_model,
    vision_lm_tp1,
)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return save_tiny_family("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl") / "hf")


@pytest.fixture(scope="module")
def ours(vl_dir, mcore_ctx):
    return vision_lm_tp1(vl_dir, mcore_ctx)


def test_logits_match_transformers_with_images_at_tp1(vl_dir, ours, mcore_ctx):
    batch = image_batch()
    err, _, _ = logits_error(vl_dir, ours, batch, mcore_ctx.pgs.tp)
    print(f"qwen2.5-vl tp1 logits max |ours - transformers| = {err:.2e} over {int(batch['attention_mask'].sum())} "
          "tokens")
    assert err <= 1e-5
    assert not ours.tower.training and not any(p.requires_grad for p in ours.tower.parameters())  # frozen


def test_positions_are_transformers_rope_index():
    hf = tiny_vl_model()
    batch = image_batch()
    want, want_deltas = hf.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                                batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    got, deltas = mrope_position_ids(batch["input_ids"], batch["image_grid_thw"], IMAGE, 2, batch["attention_mask"])
    assert torch.equal(got, want) and torch.equal(deltas, want_deltas[:, 0])


def test_megatron_multimodal_rotary_table_is_transformers(ours):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    hf_rope = Qwen2_5_VLRotaryEmbedding(tiny_vl_model().config.text_config)
    batch = image_batch()
    pos, _ = mrope_position_ids(batch["input_ids"], batch["image_grid_thw"], IMAGE, 2, batch["attention_mask"])
    cos, sin = hf_rope(torch.zeros(1, dtype=torch.float32), pos)  # [B, S, head_dim]
    emb = ours.lm.rotary_pos_emb(pos, ours.lm.mrope_section)[:, :, 0].transpose(0, 1)  # [B, S, head_dim]
    assert torch.equal(emb.cos(), cos) and torch.equal(emb.sin(), sin)


def test_language_model_prefix_checkpoint_loads_the_same(vl_dir, ours, mcore_ctx, tmp_path):
    """transformers 4.5x wrote `model.language_model.*` and `model.visual.*`: the same tensors load."""
    from safetensors.torch import load_file, save_file

    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.vision import build_vision_lm

    sd = load_file(str(vl_dir / "model.safetensors"))
    renamed = {("model.language_model." + k[6:] if k.startswith("model.") else
                "model." + k if k.startswith("visual.") else k): v for k, v in sd.items()}
    assert any(k.startswith("model.visual.") for k in renamed)
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((vl_dir / "config.json").read_text())
    other = build_vision_lm(str(tmp_path), "actor", ModelConfig(dtype="fp32", attention_backend="sdpa"),
                            ParallelConfig(tp=1, pp=1), mcore_ctx)
    for a, b in ((ours.lm, other.lm), (ours.tower, other.tower)):
        theirs = dict(b.named_parameters())
        assert all(torch.equal(p, theirs[k]) for k, p in a.named_parameters())


def test_flat_hub_config_reads_the_same(vl_dir):
    """The Hub's config.json keeps the LM's fields at the top level with rope_scaling type "mrope"."""
    from rlhf_mcore.models.registry import language_config
    from rlhf_mcore.models.transformer_config import architecture_errors

    nested = json.loads((vl_dir / "config.json").read_text())
    text = {k: v for k, v in nested["text_config"].items() if k not in ("model_type", "rope_parameters")}
    params = nested["text_config"]["rope_parameters"]
    hub = {**{k: v for k, v in nested.items() if k != "text_config"}, **text, "rope_theta": params["rope_theta"],
           "rope_scaling": {"type": "mrope", "mrope_section": params["mrope_section"]}}
    flat, ours = language_config(hub), language_config(nested)
    assert architecture_errors(hub, "hub") == [] and architecture_errors(nested, "nested") == []
    assert flat["rope_scaling"] == {"mrope_section": [2, 3, 3], "rope_type": "default"}
    assert all(flat[k] == ours[k] for k in text) and flat["model_type"] == "qwen2_5_vl"


@pytest.mark.parametrize("change, field", [
    ({"mrope_section": [2, 3, 4]}, "mrope_section"),
    ({"rope_type": "linear", "factor": 2.0}, "rope type"),
])
def test_unsupported_config_is_one_line_naming_the_field(vl_dir, change, field):
    from rlhf_mcore.models.transformer_config import architecture_errors

    hf = json.loads((vl_dir / "config.json").read_text())
    hf["text_config"]["rope_parameters"].update(change)
    errs = architecture_errors(hf, "config.json")
    assert len(errs) == 1 and field in errs[0] and "\n" not in errs[0]


def test_validate_refuses_what_is_not_there_yet(vl_dir):
    from rlhf_mcore.config import load_config, validate

    cfg = load_config(None, [f"model.hf_path={vl_dir}", "parallel.pp=2", "parallel.sequence_parallel=true",
                             "parallel.tp=2", "rollout.engine=sglang", "algorithm.filter_groups.enable=true",
                             "model.freeze_vision_tower=false", "trainer.export_hf=true"], check=False)  # export: fine
    errs = validate(cfg, world_size=4)
    for start in ("model.freeze_vision_tower: a trained tower runs at parallel.pp=1 only",
                  "parallel.sequence_parallel: not yet with Qwen2.5-VL"):
        assert sum(e.startswith(start) for e in errs) == 1, (start, errs)
    assert not [e for e in errs if e.startswith("trainer.export_hf")]  # a trained tower exports (convert/export.py)
    assert not [e for e in errs if "images" in e and e.startswith("algorithm.filter_groups")]  # carried (exchange)
    assert not [e for e in errs if "Qwen2.5-VL" in e and e.startswith("rollout.engine")]  # both engines take images
    ok = load_config(None, [f"model.hf_path={vl_dir}"], check=False)
    assert not [e for e in validate(ok) if "Qwen2.5-VL" in e or "vision" in e]
    inline = load_config(None, ["model.family=qwen2_5_vl", "model.num_layers=2", "model.hidden_size=64",
                                "model.ffn_hidden_size=96", "model.num_attention_heads=4", "model.vocab_size=300"],
                         check=False)
    assert any(e.startswith("model.hf_path: Qwen2.5-VL is built from its HF directory") for e in validate(inline))


def test_video_tokens_and_left_padding_are_refused(ours):
    from rlhf_mcore.models.vision import vision_lm_forward

    with pytest.raises(ValueError, match="video tokens"):
        vision_lm_forward(ours, torch.tensor([[5, VIDEO, 6]]))
    with pytest.raises(ValueError, match="Pad the rows on the right"):
        vision_lm_forward(ours, torch.tensor([[0, 5, 6]]), attention_mask=torch.tensor([[0, 1, 1]]))
