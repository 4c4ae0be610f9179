"""torchrun worker of tests/dist/rollout/test_engine_layouts.py: an engine with its own copy of the model (SGLang's
contract) at every training layout, on CPU with gloo; the SGLang server is a stand-in (SGLang needs a GPU).

    torchrun --nproc_per_node 4 -m tests.worker engine_layouts --layouts 1x1,2x1,1x2,2x2 --out DIR

Per layout TPxPP (megatron groups re-initialised in between) and per tiny HF case:
- weights: the actor is loaded at that layout from a random HF model; every rank's `FullWeights` -> HF names
  must equal the converter's HF state dict of the actor's full (TP1/PP1) state dict, bitwise and in order;
  the engine's bucketed refresh sends exactly those tensors and counts the bytes received over TP/PP;
- rollout: each DP replica's rows are split over its TP x PP ranks (each server gets exactly its `share`),
  and every rank of the replica returns the same batch, rows in the replica's order.
Rank 0 writes DIR/result.json: {"<layout> <case>": [problems...]} (empty lists = pass) and the rows each
rank's server generated.
"""
from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion, load_full_state_dict
from rlhf_mcore.models.full_weights import FullWeights, hf_weights
from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf
from rlhf_mcore.parallel import destroy_distributed, init_distributed, reset_model_parallel
from rlhf_mcore.rollout.base import EngineSetup
from rlhf_mcore.rollout.replicas import share
from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny_hf import case_model

N_SAMPLES = 2


class StandIn:
    """The calls the engine makes on an sglang.Engine: refresh recorded, generate answers from the prompt."""

    def __init__(self):
        self.sent, self.rows, self.flushes = [], [], 0

    def update_weights_from_tensor(self, named, flush_cache):
        self.sent.append([(n, t.clone()) for n, t in named])
        return True, "Success"

    def flush_cache(self):
        self.flushes += 1

    def generate(self, input_ids, sampling_params, return_logprob):
        if sampling_params["max_new_tokens"] == 0:  # the engine's prefill of shared prompts: no rows
            return [{"output_ids": [], "meta_info": {"finish_reason": {"type": "length"}}} for _ in input_ids]
        self.rows += input_ids
        return [{"output_ids": [sum(p) % 200 + 1, len(p)], "meta_info": {
            "finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, 0, None), (-1.0, 0, None)]}}
            for p in input_ids]


def actor_at_layout(case: str, ctx):
    """(actor shard at this layout, HF config, the converter's HF state dict of the full actor)."""
    hf_model = case_model(case)
    hf_cfg = json.loads(hf_model.config.to_json_string())
    full = hf_to_mcore(hf_model.state_dict(), hf_cfg, role="actor")
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_full_state_dict(model, full, ctx.tp_rank, ctx.dims.tp)
    return model, hf_cfg, mcore_to_hf(full, hf_cfg, role="actor")


def weight_problems(model, hf_cfg: dict, want: dict, engine) -> list[str]:
    got = list(hf_weights(FullWeights(model, engine.ctx), hf_cfg))
    problems = [] if [n for n, _ in got] == list(want) else ["FullWeights: HF names or order differ"]
    problems += [f"FullWeights: {n} differs" for n, t in got if n in want and not torch.equal(t, want[n])]
    metrics = engine.update_weights(model)
    sent = [pair for bucket in engine.engine.sent for pair in bucket]
    if [n for n, _ in sent] != list(want) or not all(torch.equal(t, want[n]) for n, t in sent):
        problems.append("update_weights: sent tensors differ from the actor's full weights")
    if any(sum(t.numel() * 4 for _, t in b) > engine.bucket_bytes and len(b) > 1 for b in engine.engine.sent):
        problems.append("update_weights: a bucket of several tensors exceeds the bucket size")
    moved = metrics["perf/weight_reshard_gb"] > 0
    if engine.engine.flushes != 1 or moved != (engine.ctx.dims.tp * engine.ctx.dims.pp > 1):
        problems.append(f"update_weights: flushes={engine.engine.flushes}, metrics={metrics}")
    return problems


def rollout_problems(engine, ctx) -> tuple[list[str], int]:
    """Each DP replica has its own 5 prompts (10 rows with n=2): the split and the reassembly order."""
    prompts = [[ctx.dp_rank * 50 + i + 1] * (i + 1) for i in range(5)]
    rows = [p for p in prompts for _ in range(N_SAMPLES)]
    batch = engine.generate(prompts, SamplingParams(n=N_SAMPLES, max_new_tokens=2))
    problems = []
    mp_size, mp_rank = dist.get_world_size(ctx.pgs.mp), dist.get_rank(ctx.pgs.mp)
    if engine.engine.rows != rows[share(len(rows), mp_size, mp_rank)]:
        problems.append(f"rank {ctx.rank}: its server got {engine.engine.rows}, not its share")
    for i, row in enumerate(rows):
        got = batch.tokens[i, : len(row) + 2].tolist()
        if got != row + [sum(row) % 200 + 1, len(row)]:
            problems.append(f"rank {ctx.rank}: row {i} is {got}, expected prompt {row} and its response")
    copies = [None] * mp_size
    dist.all_gather_object(copies, batch.tokens.tolist(), group=ctx.pgs.mp)
    if any(c != copies[0] for c in copies):
        problems.append(f"rank {ctx.rank}: the ranks of one DP replica returned different batches")
    return problems, len(engine.engine.rows)


def check(case: str, ctx) -> tuple[list[str], int]:
    model, hf_cfg, want = actor_at_layout(case, ctx)
    setup = EngineSetup(model=model, hf_config=hf_cfg, ctx=ctx, pad_id=0, decode=None, micro_batch_size=0,
                        replica_rows=10, seed=1)
    engine = SGLangRolloutEngine(setup, bucket_bytes=30_000, server=StandIn())
    problems = weight_problems(model, hf_cfg, want, engine)
    more, generated = rollout_problems(engine, ctx)
    return problems + more, generated


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layouts", required=True, help="comma-separated TPxPP, e.g. 2x1,1x2,2x2")
    parser.add_argument("--cases", default="qwen2,llama_tied")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = {}
    for layout in args.layouts.split(","):
        tp, pp = (int(x) for x in layout.split("x"))
        reset_model_parallel()
        ctx = init_distributed(tp, pp, seed=1)
        for case in args.cases.split(","):
            try:
                problems, generated = check(case, ctx)
            except Exception:  # noqa: BLE001 - reported by the test
                problems, generated = [traceback.format_exc()], -1
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, (problems, generated))
            result[f"{layout} {case}"] = {"problems": [p for ps, _ in everyone for p in ps],
                                          "rows_per_rank": [g for _, g in everyone]}
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1))
    destroy_distributed()
    return 0


def entry(argv: list[str]) -> int:
    return main(argv)
