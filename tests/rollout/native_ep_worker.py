"""torchrun worker of tests/rollout/test_native_ep.py: the native engine decoding a tiny Qwen3-MoE at EP2 (2 ranks).

    torchrun --nproc_per_node 2 -m tests.rollout.native_ep_worker --hf-dir D --out OUT.json

The two ranks' rows end at different steps and they hold different numbers of micro-batches: rank 0 two rows in
two micro-batches, each ending at its first token (every token is a stop token), rank 1 one row decoding 6 tokens
greedily. At EP2 every MoE forward exchanges tokens between the two ranks, so they must decode in lockstep. Then
the same requests at EP1 (the ranks independent). Rank 0 writes both layouts' tokens and log-probs to OUT.json.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel, torchrun_env
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams


def decode(hf_dir: str, ep: int, vocab: int) -> dict:
    reset_model_parallel()
    ctx = init_distributed(1, 1, ep=ep)
    hf_cfg = read_hf_config(hf_dir)
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(model, hf_dir, hf_cfg, 0, 1)
    model.eval()
    if ctx.rank == 0:
        prompts, size, stops = [[3, 4, 5], [6, 7]], 1, tuple(range(vocab))
    else:
        prompts, size, stops = [[8, 9, 10, 11]], 0, ()
    engine = NativeRolloutEngine(model, ctx, pad_id=0, micro_batch_size=size)
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=stops))
    dist.barrier()
    mine = {"tokens": batch.tokens.tolist(), "lengths": batch.response_lengths.tolist(),
            "logprobs": batch.rollout_logprobs.tolist()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    init_logger(torchrun_env()[0])
    vocab = read_hf_config(args.hf_dir)["vocab_size"]
    result = {f"ep{ep}": decode(args.hf_dir, ep, vocab) for ep in (2, 1)}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
