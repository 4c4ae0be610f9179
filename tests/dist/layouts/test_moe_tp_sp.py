"""Full fine-tuning of the tiny MoE (configs/tiny_moe_grpo.yaml: 8 whole experts top-2, no LoRA) at TP2 with
sequence parallelism gives the 1x1 numbers after three optimizer steps (gloo, 2 ranks). At EP 1 megatron 0.16.1
marks expert weights `allreduce=True`, so DDP reduced their gradients over the data-parallel group only; each TP
rank trained its copy of the experts on its own sequence shard and the actor's log-probs were 0.38 off after three
steps (0.72 at the preset's lr). `moe_compat.reduce_experts_over_expert_dp` (M3) reduces them over the
expert-data-parallel group, which spans TP."""
import re

import pytest

from tests.dist.layouts.test_layouts_ep import MOE, run_tool
from tests.support.layouts import parse_table

pytestmark = pytest.mark.dist


def test_full_moe_at_tp2_sequence_parallel_equals_1x1_after_three_steps():
    # actor lr 1e-3 (the preset's 1e-2 also passes): Adam's first steps scale each gradient element by 1/(|g| + eps),
    # so elements with |g| ~ eps turn fp32 summation-order noise into ~1e-5 log-prob differences at lr 1e-2
    out = run_tool(2, MOE, "1x1,2x1", "--steps", "3", "actor.optim.lr=1e-3")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = parse_table(out.stdout)
    assert rows[0][:3] == ["tp1", "pp1", "dp2"] and rows[1][:4] == ["tp2", "pp1", "dp1", "sp"]
    moved = re.search(r"actor logp ([0-9.e+-]+), values ([0-9.e+-]+)", out.stdout)
    assert float(moved[1]) > 1e-1 and float(moved[2]) > 1e-2  # the experts trained: the comparison means something
    assert "PASS" in out.stdout
