"""torchrun worker of tests/dist/models/test_moe_full_weights.py: a tiny HF Qwen3-MoE at expert-parallel layouts.

    torchrun --nproc_per_node 2 -m tests.worker moe_full_weights --hf-dir D --work W --layouts 1x1,1x2

Per layout TPxEP (megatron groups re-initialised in between): the HF weights are loaded straight into this
rank's shard, then every parameter moves by noise seeded from its full-model name (the same change at every
layout: "trained" weights that are not the HF ones); then
- `FullWeights` -> HF names on every rank; rank 0 writes them to W/full_<layout>.pt, and every rank checks that
  all ranks got the same tensors and that an EP>1 rank received the experts it lacks (bytes_received);
- the shards are saved as a megatron dist-checkpoint W/ckpt_<layout> (what a training checkpoint's actor/ holds),
  for the test to export with `rlhf_mcore.convert.export`;
- the logits of one fixed batch at this layout go to W/logits_<layout>.pt.
Exits 1 when a check failed (the problems are printed).
"""
from __future__ import annotations

import argparse
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.full_weights import FullWeights, global_key, hf_weights, partition_dim, tp_split
from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env


@torch.no_grad()
def perturb_(model, tp_rank: int, tp_size: int) -> None:
    """Add 0.01 x noise drawn from the full tensor's name: layout-independent."""
    for key, param in model.named_parameters():
        full_key = global_key(model, key)
        dim = partition_dim(param, key)
        shape = [n * tp_size if i == dim else n for i, n in enumerate(param.shape)]
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(full_key.encode())))
        param.add_(0.01 * tp_split(noise, dim, key, tp_rank, tp_size))


def check_layout(args, tp: int, ep: int) -> list[str]:
    from megatron.core import dist_checkpointing

    name = f"{tp}x{ep}"
    reset_model_parallel()
    ctx = init_distributed(tp, 1, ep=ep)
    hf_cfg = read_hf_config(args.hf_dir)
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(model, args.hf_dir, hf_cfg, ctx.tp_rank, ctx.dims.tp)
    perturb_(model, ctx.tp_rank, ctx.dims.tp)
    model.eval()
    problems = []
    full = FullWeights(model, ctx)
    got = {k: v.clone() for k, v in hf_weights(full, hf_cfg)}
    if ep > 1 and not full.bytes_received:
        problems.append(f"{name} rank {ctx.rank}: no expert came over the EP group")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {k: v.sum().item() for k, v in got.items()})
    if any(e != everyone[0] for e in everyone):
        problems.append(f"{name} rank {ctx.rank}: the ranks' full weights differ")
    ckpt = Path(args.work) / f"ckpt_{name}"
    if ctx.rank == 0:
        torch.save(got, Path(args.work) / f"full_{name}.pt")
        ckpt.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(ckpt))
    tokens = torch.randint(0, hf_cfg["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(tokens.size(1))[None].expand_as(tokens)
    with torch.no_grad():
        logits = full_logits(model, model(tokens, pos, None), ctx.pgs.tp)
    if ctx.rank == 0:
        torch.save({"tokens": tokens, "logits": logits}, Path(args.work) / f"logits_{name}.pt")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--layouts", required=True, help="comma-separated TPxEP, e.g. 1x1,1x2,2x2")
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    problems = []
    for layout in args.layouts.split(","):
        tp, ep = (int(x) for x in layout.split("x"))
        problems += check_layout(args, tp, ep)
    for problem in problems:
        print("PROBLEM", problem, flush=True)
    destroy_distributed()
    return int(bool(problems))


def entry(argv: list[str]) -> int:
    return main(argv)
