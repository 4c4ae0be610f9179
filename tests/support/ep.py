"""What the EP2-vs-EP1 rollout workers share (tests/cases/native_ep.py, multi_turn_ep_worker.py): the tiny
HF MoE at a layout, every rank's result gathered, and the torchrun entry point that runs a request at EP2 then
EP1 and writes both layouts' results from rank 0."""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env


def model_at(hf_dir: str, ep: int, **init):
    """(ctx, the HF model's weights in an fp32 megatron actor at expert parallelism `ep`, in eval mode)."""
    reset_model_parallel()
    ctx = init_distributed(1, 1, ep=ep, **init)
    hf_cfg = read_hf_config(hf_dir)
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(model, hf_dir, hf_cfg, 0, 1)
    model.eval()
    return ctx, model


def gather_ranks(mine: dict) -> dict:
    """{"ranks": every rank's `mine`, in rank order} (on every rank)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone}


def run_ep_worker(request: Callable[[str, int], dict], argv: list[str]) -> int:
    """--hf-dir D --out OUT.json: request(D, ep) at EP2 then EP1; rank 0 writes {"ep2": ..., "ep1": ...}."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    result = {f"ep{ep}": request(args.hf_dir, ep) for ep in (2, 1)}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    destroy_distributed()
    return 0
