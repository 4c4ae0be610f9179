"""torchrun worker of tests/dist/models/test_hf_layouts.py: many conversions in one launch (gloo, CPU).

    torchrun --nproc_per_node 2 -m tests.worker convert_layouts --work DIR --layouts 1x1,2x1,1x2,1x1x2 --cases a,b

DIR/hf/<case>/ holds tiny HF checkpoints. Per layout TPxPP[xEP] (megatron groups re-initialised in between, the
default group kept): for every case, `hf-to-mcore` at that layout into DIR/mcore/<case>_<layout>, then
`verify` of that checkpoint at the same layout and of DIR/mcore/<case>_1x1 (when it exists) at this
layout (megatron reshards on load). Each verify prints its `verify ckpt=...` line on one rank;
the test parses them. Exits 1 when a verify failed.
"""
from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from rlhf_mcore.logs import init_logger
from rlhf_mcore.parallel import destroy_distributed, reset_model_parallel, torchrun_env
from tests.support.layouts import parse_work_layouts_cases, split_layouts
from tools.convert_checkpoint import run


def convert_and_verify(work: Path, case: str, tp: int, pp: int, ep: int = 1) -> int:
    hf_dir, out = work / "hf" / case, work / "mcore" / (f"{case}_{tp}x{pp}" + (f"x{ep}" if ep > 1 else ""))
    layout = ["--tp", str(tp), "--pp", str(pp), "--ep", str(ep)]
    run(["hf-to-mcore", "--hf-dir", str(hf_dir), "--out", str(out), "--overwrite", *layout])
    failures = run(["verify", "--hf-dir", str(hf_dir), "--mcore-dir", str(out), *layout])
    reference = work / "mcore" / f"{case}_1x1"
    if (tp, pp, ep) != (1, 1, 1) and reference.is_dir():
        failures += run(["verify", "--hf-dir", str(hf_dir), "--mcore-dir", str(reference), *layout])
    return failures


def main(argv: list[str]) -> int:
    args = parse_work_layouts_cases(argv)
    init_logger(torchrun_env()[0])
    failures = 0
    for tp, pp, ep in split_layouts(args.layouts):
        reset_model_parallel()
        for case in args.cases.split(","):
            failures += convert_and_verify(args.work, case, tp, pp, ep)
    dist.barrier()
    destroy_distributed()
    return int(failures > 0)


def entry(argv: list[str]) -> int:
    return main(argv)
