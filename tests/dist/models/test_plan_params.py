"""The memory plan's parameter count per rank (rlhf_mcore/plan/params.py) equals what megatron builds on every rank
at TP2, PP2, EP2 and TP2 x EP2 (2 gloo ranks, the expert group spanning TP): the heads split over TP, the stages'
embedding / final norm / head (a tied head's copy on the last stage), whole experts over EP (and the
expert-data-parallel group: 2 ranks at TP2, 1 at EP2); actor and critic. TP1 is in tests/unit/plan/."""
import json
import re

import pytest

from tests.launch import worker
from tests.support.tiny_hf import case_model
from tests.support.tiny_moe import tiny_mixtral, tiny_moe

pytestmark = pytest.mark.dist
DENSE = ("llama_tied", "qwen2", "qwen3", "llama31")
MOE = ("qwen3_moe", "mixtral")


def test_counts_per_rank_at_tp2_pp2_and_ep2(tmp_path):
    models = {case: case_model(case) for case in DENSE}
    models.update(qwen3_moe=tiny_moe(False), mixtral=tiny_mixtral())
    for name, model in models.items():
        (tmp_path / f"{name}.json").write_text(model.config.to_json_string())
    out = worker(2, ("plan_params", "--work", tmp_path, "--layouts", "2x1,1x2,1x1x2,2x1x2", "--cases",
                     ",".join(models)), extra_env={"OMP_NUM_THREADS": "1"}, timeout=600)
    lines = re.findall(r"plan_params case=(\S+) layout=(\S+) role=(\S+) mismatched=(\d+)", out.stdout)
    assert len(lines) == 2 * (2 * len(models) + 2 * len(MOE)), out.stdout[-2000:]  # EP2: the MoE models only
    assert [line for line in lines if line[3] != "0"] == []
    assert json.loads((tmp_path / "mixtral.json").read_text())["num_local_experts"] == 8
