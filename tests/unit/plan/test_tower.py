"""The memory plan counts a vision LM's tower (rlhf_mcore/plan/params.py `tower_params`, plan/static.py `tower_bytes`):
its parameters are those of transformers' tower + merger (the tiny VLM, the Qwen2.5-VL-3B shape, and Qwen3-VL-8B's with
its DeepStack mergers), LM + tower are transformers' whole model, and the plan's tower term is the bytes of the tower
the trainer builds (frozen), plus its gradients and Adam's state when trained."""
import json

import pytest
import torch

from rlhf_mcore.config.load import load_config
from rlhf_mcore.models.vision import build_vision_tower
from rlhf_mcore.plan.params import Shape, rank_params, vision_params
from rlhf_mcore.plan.phases import phase_terms
from rlhf_mcore.plan.static import ADAM_BYTES, GRAD_BYTES, Layout
from tests.support.paths import CONFIGS, ROOT
from tests.support.shapes import HF_SHAPES
from tests.support.tiny_vl import hf_param_count
from tools.bench.vision_bench import QWEN25_VL_3B

TINY = json.loads((ROOT / "data" / "tiny_vlm" / "config.json").read_text())
# Qwen3-VL-8B's shape (LM 36 x 4096, tower 27 x 1152, DeepStack from blocks 8, 16, 24)
QWEN3_VL_8B = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
               "tie_word_embeddings": False, "image_token_id": 151655, "video_token_id": 151656,
               "text_config": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                               "vocab_size": 151936, "tie_word_embeddings": False,
                               "rope_parameters": {"rope_type": "default", "rope_theta": 5000000,
                                                   "mrope_section": [24, 20, 20], "mrope_interleaved": True}},
               "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                                 "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                 "out_hidden_size": 4096, "num_position_embeddings": 2304,
                                 "deepstack_visual_indexes": [8, 16, 24]}}

QWEN3_VL_30B_A3B = HF_SHAPES["qwen3-vl-30b-a3b"]


def meta_params(module_fn) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in module_fn().parameters())


@pytest.mark.parametrize("hf", [TINY, QWEN25_VL_3B, QWEN3_VL_8B, QWEN3_VL_30B_A3B],
                         ids=["tiny", "qwen2.5-vl-3b", "qwen3-vl-8b", "qwen3-vl-30b-a3b"])
def test_lm_and_tower_are_transformers_whole_model(hf):
    tower = meta_params(lambda: build_vision_tower(hf, torch.float32, "meta"))
    assert vision_params(hf) == Shape.of(hf).tower == tower
    whole = hf_param_count(hf)
    assert rank_params(Shape.of(hf), tp=1, pp=1, ep=1, pp_rank=0, vocab_divisible_by=1) + tower == whole


@pytest.mark.parametrize("frozen", [True, False])
def test_the_tower_term_is_the_built_towers_bytes(frozen):
    cfg = load_config(str(CONFIGS / "tiny_vlm_grpo.yaml"), [f"model.freeze_vision_tower={str(frozen).lower()}"],
                      check=False)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.model.dtype]
    built = build_vision_tower(TINY, dtype, "cpu")
    weights = sum(p.numel() * p.element_size() for p in built.parameters())
    count = sum(p.numel() for p in built.parameters())
    trained = 0 if frozen else count * (GRAD_BYTES + ADAM_BYTES[cfg.model.dtype])
    terms = phase_terms(cfg, Shape.of(TINY), Layout(1, 1, 1, 1))
    for phase in ("rollout", "log_prob", "update", "optimizer"):
        assert terms[phase]["tower"] == weights + trained  # the actor's only: no reference, no critic here
    with_ref = phase_terms(load_config(str(CONFIGS / "tiny_vlm_grpo.yaml"), ["actor.use_kl_loss=true"], check=False),
                           Shape.of(TINY), Layout(1, 1, 1, 1))
    assert with_ref["update"]["tower"] == 2 * weights  # + the reference's frozen copy
