"""The memory plan's parameter count per rank (rlhf_mcore/plan/params.py) equals the parameters of the model megatron
builds, for every family, tied and untied heads, q/k norms, q/k/v biases, MoE experts, and the critic's scalar head
(TP1 here; TP2, PP2 and EP2 in tests/dist/models/test_plan_params.py)."""
import json

import pytest

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.plan.params import Shape, rank_params
from tests.support.tiny_hf import CASES, case_model
from tests.support.tiny_moe import tiny_mixtral, tiny_moe


def hf_configs() -> dict:
    configs = {case: json.loads(case_model(case).config.to_json_string()) for case in CASES}
    configs["qwen3_moe"] = json.loads(tiny_moe(False).config.to_json_string())
    configs["mixtral"] = json.loads(tiny_mixtral().config.to_json_string())
    return configs


CONFIGS = hf_configs()


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_count_equals_the_built_model(name, role, mcore_ctx):
    hf = CONFIGS[name]
    model = build_for_conversion(hf, role, mcore_ctx, "fp32")
    built = sum(p.numel() for p in model.parameters())
    assert rank_params(Shape.of(hf), tp=1, pp=1, ep=1, pp_rank=0, lm_head=role == "actor") == built
