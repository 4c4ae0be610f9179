"""torchrun worker of tests/dist/rollout/test_native_ep.py: multi-turn partial rollouts (trainer/partial_rollout.py,
rounds of 16 tokens) through the native engine on a tiny Qwen3-MoE at EP2 (2 gloo ranks, DP2), two steps, then the
same at EP1 (the ranks independent).

    torchrun --nproc_per_node 2 -m tests.worker partial_ep --hf-dir D --out OUT.json

The ranks' samples differ as in tests/cases/multi_turn_ep.py (rank 0 calls a tool every turn, rank 1 only now and
then), so they need different numbers of rounds; at EP2 the expert group agrees on each round and a rank that has
its batch joins with no rows. Rank 0 writes, per layout, step and rank, the trained rows, log-probs, loss masks and
turn spans, the async metrics, and the (rows, max_new_tokens) of every engine call.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from rlhf_mcore.trainer.partial_rollout import PartialRollouts
from tests.cases.multi_turn_ep import PARAMS, FakeExecutor, Recorder, parser
from tests.support.ep import gather_ranks, model_at, run_ep_worker
from tests.support.multi_turn import Row, tool_env

BUDGET = 96
CONFIG = SimpleNamespace(rollout=SimpleNamespace(n=2, max_response_length=BUDGET),
                         async_training=SimpleNamespace(partial_rollout=True, staleness_threshold=1, round_tokens=16,
                                                        continuous=True, max_num_seqs=0))


def prompts(rank: int):
    """This rank's batches of one prompt each, distinct per rank and batch."""
    k = 0
    while True:
        k += 1
        yield [Row((3 + k, 4, 5 + rank, 6))]


def rollout(hf_dir: str, ep: int) -> dict:
    ctx, model = model_at(hf_dir, ep, seed=1234)
    tok = ByteTokenizer()
    env = tool_env(tok, FakeExecutor(), parse=parser(ctx.rank), max_turns=4)
    env.ctx, env.pad_id = ctx, 0  # the tiny model's vocabulary (250) has no ByteTokenizer pad id
    engine = Recorder(NativeRolloutEngine(model, ctx, pad_id=0, decode=tok.decode))
    partial = PartialRollouts(CONFIG, 0, ctx.device, engine, env=env)
    batches = prompts(ctx.rank)
    steps = []
    for step in range(2):
        rows, batch, report = partial.generate(SimpleNamespace(engine=engine), lambda: next(batches),
                                               dataclasses.replace(PARAMS, max_new_tokens=BUDGET), step)
        steps.append({"prompts": [list(r.prompt_ids) for r in rows], "tokens": batch.tokens.tolist(),
                      "logprobs": batch.rollout_logprobs.tolist(), "mask": batch.loss_mask.int().tolist(),
                      "spans": batch.turns.spans, "lengths": batch.total_lengths.tolist(),
                      "report": {k: v for k, (v, _) in report.items()}})
    return gather_ranks({"steps": steps, "calls": engine.calls, "lockstep": engine.lockstep_group is not None})


def entry(argv: list[str]) -> int:
    return run_ep_worker(rollout, argv)
