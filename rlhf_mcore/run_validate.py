"""Validation: greedy generation over the whole validation set (sharded over DP), reward per
data_source, reduced over ranks into `val/test_score/<data_source>` and `val/test_score/mean`."""
from __future__ import annotations

import logging

import torch.distributed as dist

from rlhf_mcore.phases import decode_responses, sampling_params

log = logging.getLogger("rlhf_mcore")


def validate(run) -> dict[str, float]:
    cfg, ctx = run.cfg, run.ctx
    prompts, keep = run.val_sampler.shard()  # every DP rank gets the same count; keep[i] = False on padding rows
    rollout = run.engine.generate([list(p.prompt_ids) for p in prompts],
                                  sampling_params(cfg, run.stop_ids, 0, validation=True),
                                  show_progress=ctx.is_logging_rank)
    scores, _ = run.scorer(rollout, prompts, 1)
    if ctx.is_logging_rank and prompts:  # one sample, so users see what the model writes
        response = decode_responses(rollout, run.tokenizer.decode)[0]
        log.info("validation sample (score %.3f): %r -> %r", float(scores[0]),
                 prompts[0].messages[-1]["content"][-200:], response[:400])
    sums: dict[str, list[float]] = {}
    for p, s, k in zip(prompts, scores.tolist(), keep):
        if k:
            total, count = sums.get(p.data_source, [0.0, 0.0])
            sums[p.data_source] = [total + s, count + 1]
    gathered: list = [None] * ctx.dims.dp
    dist.all_gather_object(gathered, sums, group=ctx.pgs.dp)
    merged: dict[str, list[float]] = {}
    for part in gathered:
        for source, (total, count) in part.items():
            merged.setdefault(source, [0.0, 0.0])
            merged[source][0] += total
            merged[source][1] += count
    metrics = {f"val/test_score/{src}": t / max(c, 1) for src, (t, c) in merged.items()}
    all_t, all_c = sum(t for t, _ in merged.values()), sum(c for _, c in merged.values())
    metrics["val/test_score/mean"] = all_t / max(all_c, 1)
    return metrics
