"""torchrun worker of tests/unit/models/test_qwen3_moe.py: a tiny HF Qwen3-MoE directory loaded straight into our
model at expert parallelism --ep (experts split over the ranks; megatron's alltoall token dispatcher), fp32
logits of one batch against transformers'. Prints `moe ep=N rank=R logits_max=X` per rank; exits 1 past 1e-4."""
from __future__ import annotations

import argparse

import torch

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.parallel import destroy_distributed, init_distributed, torchrun_env


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--ep", type=int, required=True)
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    ctx = init_distributed(1, 1, ep=args.ep)
    from transformers import AutoModelForCausalLM

    hf_cfg = read_hf_config(args.hf_dir)
    ours = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(ours, args.hf_dir, hf_cfg, ctx.tp_rank, ctx.dims.tp)
    ours.eval()
    local = len(ours.decoder.layers[0].mlp.experts.local_experts)
    hf = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    tokens = torch.randint(0, hf_cfg["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(ctx.rank))
    pos = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        err = (hf(tokens).logits - full_logits(ours, ours(tokens, pos, None), ctx.pgs.tp)).abs().max().item()
    print(f"moe ep={args.ep} rank={ctx.rank} local_experts={local} logits_max={err:.3e}", flush=True)
    destroy_distributed()
    return int(err > 1e-4)


def entry(argv: list[str]) -> int:
    return main(argv)
