"""torchrun worker of tests/dist/models/test_plan_params.py: the memory plan's parameter count per rank
(rlhf_mcore/plan/params.py) against the model megatron builds, at each layout and for each config.

    torchrun --nproc_per_node 2 -m tests.worker plan_params --work DIR --layouts 2x1,1x2,1x1x2 --cases a,b

DIR/<case>.json are HF config.json dicts. Every rank compares its own count (actor and critic); rank 0 prints one
`plan_params case=... layout=... role=... mismatched=N` line per pair, N = ranks whose count differs.
"""
from __future__ import annotations

import json

import torch
import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.plan.params import Shape, rank_params
from tests.support.layouts import each_layout


def entry(argv: list[str]) -> int:
    failures = 0
    for args, layout, ctx in each_layout(argv):
        for case in args.cases.split(","):
            hf = json.loads((args.work / f"{case}.json").read_text())
            if ctx.dims.ep > 1 and not Shape.of(hf).experts:
                continue
            for role in ("actor", "critic"):
                built = sum(p.numel() for p in build_for_conversion(hf, role, ctx, "fp32").parameters())
                d = ctx.dims
                planned = rank_params(Shape.of(hf), d.tp, d.pp, d.ep, ctx.pp_rank, lm_head=role == "actor")
                bad = torch.tensor([int(built != planned)])
                dist.all_reduce(bad)
                failures += int(bad)
                if dist.get_rank() == 0:
                    print(f"plan_params case={case} layout={layout} role={role} mismatched={int(bad)}", flush=True)
    return int(failures > 0)
