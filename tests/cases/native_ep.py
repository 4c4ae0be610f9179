"""Case of tests/dist/rollout/test_native_ep.py: the native engine decoding a tiny Qwen3-MoE at EP2 (2 ranks).

    torchrun --nproc_per_node 2 -m tests.worker native_ep --hf-dir D --out OUT.json

The two ranks' rows end at different steps and they hold different numbers of micro-batches: rank 0 two rows in
two micro-batches, each ending at its first token (every token is a stop token), rank 1 one row decoding 6 tokens
greedily. At EP2 every MoE forward exchanges tokens between the two ranks, so they must decode in lockstep. Then
the same requests at EP1 (the ranks independent). Rank 0 writes both layouts' tokens and log-probs to OUT.json.
"""
from __future__ import annotations

import torch.distributed as dist

from rlhf_mcore.models.hf_io import read_hf_config
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.ep import gather_ranks, model_at, run_ep_worker


def decode(hf_dir: str, ep: int) -> dict:
    ctx, model = model_at(hf_dir, ep)
    if ctx.rank == 0:
        prompts, size, stops = [[3, 4, 5], [6, 7]], 1, tuple(range(read_hf_config(hf_dir)["vocab_size"]))
    else:
        prompts, size, stops = [[8, 9, 10, 11]], 0, ()
    engine = NativeRolloutEngine(model, ctx, pad_id=0, micro_batch_size=size)
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=stops))
    dist.barrier()
    return gather_ranks({"tokens": batch.tokens.tolist(), "lengths": batch.response_lengths.tolist(),
                         "logprobs": batch.rollout_logprobs.tolist()})


def entry(argv: list[str]) -> int:
    return run_ep_worker(decode, argv)
