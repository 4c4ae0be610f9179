"""torchrun worker of tests/dist/rollout/test_native_ep.py: a multi-turn rollout through the native engine on a tiny
Qwen3-MoE at EP2 (2 gloo ranks, DP2), then the same requests at EP1 (the ranks independent).

    torchrun --nproc_per_node 2 -m tests.worker multi_turn_ep --hf-dir D --out OUT.json

The two ranks take different numbers of turns with different budgets: rank 0 has two prompts and every turn
calls a tool with a short result, rank 1 one prompt, a tool call only when the turn's text has an odd length,
and a long result. Turns end at any ASCII letter (a stop string), so they are short and of random length.
At EP2 every MoE forward exchanges tokens between the ranks, so each turn they must agree on max_new_tokens,
and a rank that is done calls generate([]). Rank 0 writes, per layout and rank, the rows, log-probs, loss masks,
turn spans and the (rows, max_new_tokens) of every engine call to OUT.json.
"""
from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.rollout.modes import Rollout
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from tests.support.ep import gather_ranks, model_at, run_ep_worker
from tests.support.multi_turn import Row, tool_env

STOPS = tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")  # a turn ends at any letter
PARAMS = SamplingParams(n=2, max_new_tokens=64, temperature=1.0, seed=7, stop_strings=STOPS)
RESULTS = {"short": "42", "long": "121932631112635269"}


class FakeExecutor:
    """Each call's result is RESULTS[its expression] (no processes: the test is about the decode lockstep)."""

    def run(self, calls, contexts=None):
        return [SimpleNamespace(text=RESULTS[c.arguments["expression"]], error=None, timed_out=False) for c in calls]

    def submit(self, call, context=None) -> Future:
        future = Future()
        future.set_result(self.run([call])[0])
        return future

    def close(self):
        pass


class Recorder:
    """The engine, each call's (rows, max_new_tokens) recorded; its lockstep group passed on."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.lockstep_group = engine.lockstep_group

    def generate(self, prompts, params, show_progress=False):
        self.calls.append((len(prompts) * params.n, params.max_new_tokens))
        return self.engine.generate(prompts, params, show_progress)


def parser(rank: int):
    if rank == 0:
        return lambda text: [ToolCall("calculator", {"expression": "short"})]
    return lambda text: [ToolCall("calculator", {"expression": "long"})] if len(text) % 2 else []


def rollout(hf_dir: str, ep: int) -> dict:
    ctx, model = model_at(hf_dir, ep, seed=1234)
    tok = ByteTokenizer()
    prompts = [Row((3, 4, 5, 6)), Row((7, 8, 9))] if ctx.rank == 0 else [Row((10, 11, 12, 13, 14))]
    env = tool_env(tok, FakeExecutor(), parse=parser(ctx.rank), max_turns=4)
    env.ctx, env.pad_id = ctx, 0  # the tiny model's vocabulary (250) has no ByteTokenizer pad id
    engine = Recorder(NativeRolloutEngine(model, ctx, pad_id=0, decode=tok.decode))
    batch = Rollout(engine, "multi_turn", env).generate(prompts, PARAMS)
    return gather_ranks({"tokens": batch.tokens.tolist(), "logprobs": batch.rollout_logprobs.tolist(),
                         "mask": batch.loss_mask.int().tolist(), "lengths": batch.total_lengths.tolist(),
                         "prompt_lengths": batch.prompt_lengths.tolist(), "spans": batch.turns.spans,
                         "num_turns": batch.turns.num_turns, "calls": engine.calls,
                         "lockstep": engine.lockstep_group is not None})


def entry(argv: list[str]) -> int:
    return run_ep_worker(rollout, argv)
