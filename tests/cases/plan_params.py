"""torchrun worker of tests/dist/models/test_plan_params.py: the memory plan's parameter count per rank
(rlhf_mcore/plan/params.py) against the model megatron builds, at each layout and for each config: all of a rank's
parameters, its routed experts' and the expert-data-parallel group's size (`Layout.expert_dp`, over which the
distributed optimizer shards the experts' state).

    torchrun --nproc_per_node 2 -m tests.worker plan_params --work DIR --layouts 2x1,1x2,1x1x2 --cases a,b

DIR/<case>.json are HF config.json dicts. Every rank compares its own count (actor and critic); rank 0 prints one
`plan_params case=... layout=... role=... mismatched=N` line per pair, N = ranks whose count differs.
"""
from __future__ import annotations

import json

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.plan.params import Shape, rank_expert_params, rank_params
from rlhf_mcore.plan.static import Layout
from tests.support.layouts import each_layout


def entry(argv: list[str]) -> int:
    failures = 0
    for args, layout, ctx in each_layout(argv):
        for case in args.cases.split(","):
            hf = json.loads((args.work / f"{case}.json").read_text())
            if ctx.dims.ep > 1 and not Shape.of(hf).experts:
                continue
            for role in ("actor", "critic"):
                model = build_for_conversion(hf, role, ctx, "fp32")
                built = sum(p.numel() for p in model.parameters())
                experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
                d = ctx.dims
                planned = rank_params(Shape.of(hf), d.tp, d.pp, d.ep, ctx.pp_rank, lm_head=role == "actor")
                expert_dp = Layout(d.tp, d.pp, d.ep, d.dp).expert_dp  # the group sharding the experts' optimizer
                bad = torch.tensor([int(built != planned or experts != rank_expert_params(Shape.of(hf), d.pp, d.ep)
                                        or expert_dp != parallel_state.get_expert_data_parallel_world_size())])
                dist.all_reduce(bad)
                failures += int(bad)
                if dist.get_rank() == 0:
                    print(f"plan_params case={case} layout={layout} role={role} mismatched={int(bad)}", flush=True)
    return int(failures > 0)
