"""torchrun worker of tests/unit/models/test_hf_load.py: direct HF load against converter-then-load, bitwise.

    torchrun --nproc_per_node 2 -m tests.worker hf_load --work DIR --layouts 1x1,2x1,1x2,1x1x2 --cases a,b

DIR/hf/<case>/ holds tiny HF checkpoints and DIR/mcore/<case>/ their TP1 conversions (role from the
architecture). Per layout TPxPP[xEP] and case, two models of that role: one loaded with `load_hf_weights`, one from the
converted checkpoint (megatron reshards); every parameter must be bitwise equal. Prints one
`hf_load case=... layout=... mismatched=N` line per pair on rank 0; exits 1 on any mismatch.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion, load_converted
from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.weights import default_role
from tests.support.layouts import each_layout


def mismatched(work: Path, case: str, ctx) -> list[str]:
    hf_dir = work / "hf" / case
    hf_cfg = read_hf_config(hf_dir)
    role = default_role(hf_cfg)
    direct = build_for_conversion(hf_cfg, role, ctx, "fp32")
    load_hf_weights(direct, str(hf_dir), hf_cfg, ctx.tp_rank, ctx.dims.tp)
    converted = build_for_conversion(hf_cfg, role, ctx, "fp32")
    load_converted(converted, work / "mcore" / case)
    theirs = dict(converted.named_parameters())
    bad = [k for k, p in direct.named_parameters() if not torch.equal(p, theirs[k])]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, bad)
    return sorted({f"rank{r}:{k}" for r, part in enumerate(gathered) for k in part})


def main(argv: list[str]) -> int:
    failures = 0
    for args, layout, ctx in each_layout(argv):
        for case in args.cases.split(","):
            bad = mismatched(args.work, case, ctx)
            failures += bool(bad)
            if dist.get_rank() == 0:
                print(f"hf_load case={case} layout={layout} mismatched={len(bad)} {' '.join(bad[:4])}", flush=True)
    return int(failures > 0)


def entry(argv: list[str]) -> int:
    return main(argv)
