"""Multi-turn partial rollouts (rollout/partial_turns.py, trainer/partial_rollout.py) with SmolLM2's real tokenizer
and chat template: a sample that waits on a slow tool blocks nobody (the step trains the groups that finished and
carries the waiting one), its calls keep running into the next step, and the trained rows are exactly the
synchronous mode's: the sampled ids, the tool turn's ids with loss mask 0, each turn's span, the tool counts, and
each sampled token's version. Both decode paths: rounds (any engine) and continuous batching, where a sample back
from its tool joins the running call."""
from __future__ import annotations

import dataclasses
import types
from concurrent.futures import Future

import pytest
import torch

from rlhf_mcore.agent.executor import ToolResult
from rlhf_mcore.chat import tool_delta_ids
from rlhf_mcore.rollout.responses import Response, assemble_batch
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.partial_rollout import PartialRollouts
from tests.support.multi_turn import Row, smollm2_tokenizer, tool_env
from tests.unit.rollout.test_multi_turn import char_ids

EOS = 2  # SmolLM2's <|im_end|>
SLOW = 3  # prompt 3's tool call is slow: its result comes only when the test releases it
PARAMS = SamplingParams(n=2, max_new_tokens=200, temperature=1.0, stop_token_ids=(EOS,), seed=3)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


class GatedExecutor:
    """The calculator's answers as futures: at once, except calls listed in `slow` until `release()`."""

    def __init__(self, slow: set):
        self.slow, self.held, self.calls = slow, [], []

    def submit(self, call, context=None) -> Future:
        expression = call.arguments["expression"]
        self.calls.append(expression)
        future = Future()
        result = ToolResult(str(eval(expression)), None, False, 0.0)  # noqa: S307 - the test's own strings
        if expression in self.slow:
            self.held.append((future, result))
        else:
            future.set_result(result)
        return future

    def release(self) -> None:
        for future, result in self.held:
            future.set_result(result)
        self.held = []

    def close(self) -> None:
        pass


def call_text(p: int) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{p}+1"}}}}</tool_call>'


class Script:
    """Prompt p's samples: turn 1 = "p" in single-character ids + a calculator call of "p+1"; then the tool turn of
    its result; turn 2 = "#### p+1" + EOS. A row's next tokens are read off that sequence at the row's length, up
    to the end of the current turn (finish "stop") or the call's budget ("length"). Log-probs encode (position,
    version): -(position + 1) / 100 - version / 1000."""

    def __init__(self, tok, sampled_end: str = ""):
        """`sampled_end` (turn_end=sampled): turn 1 ends with the policy's own <|im_end|> after the call."""
        self.tok, self.version, self.prompt_len, self.sampled_end = tok, 0, 3, sampled_end
        self.cache: dict = {}

    def turns(self, p: int) -> tuple[list[int], list[int], list[int]]:
        if p not in self.cache:
            end = [EOS] if self.sampled_end else []
            self.cache[p] = (char_ids(self.tok, f"n{p}") + self.tok.encode(call_text(p)) + end,
                             tool_delta_ids(self.tok, [str(p + 1)], self.sampled_end),
                             char_ids(self.tok, f"#### {p + 1}") + [EOS])
        return self.cache[p]

    def full(self, p: int) -> list[int]:
        first, delta, second = self.turns(p)
        return first + delta + second

    def next_tokens(self, row: list[int], budget: int) -> tuple[list[int], str]:
        p, done = row[0], row[self.prompt_len:]
        first, delta, second = self.turns(p)
        full = first + delta + second
        assert done == full[:len(done)], "a row continues from its exact prefix"
        end = len(first) if len(done) < len(first) else len(full)
        assert not len(first) <= len(done) < len(first) + len(delta), "no row decodes inside a tool turn"
        new = full[len(done):min(end, len(done) + budget)]
        return new, "stop" if len(done) + len(new) == end else "length"

    def logprobs(self, row: list[int], n: int) -> list[float]:
        start = len(row) - self.prompt_len
        return [-(start + k + 1) / 100 - self.version / 1000 for k in range(n)]


class RoundsEngine(Script):
    def __init__(self, tok, sampled_end: str = ""):
        super().__init__(tok, sampled_end)
        self.engine, self.calls = self, []

    def generate(self, rows, params, show_progress=False):
        self.calls.append(len(rows))
        out = []
        for row in rows:
            new, reason = self.next_tokens(list(row), params.max_new_tokens)
            out.append(Response(new, self.logprobs(list(row), len(new)), reason))
        return assemble_batch([list(r) for r in rows], out, 0, "cpu")


class ContinuousEngine(Script):
    """One token per slot per tick; a feed's rows join the queue (polled every tick, blocking when nothing runs)."""

    continuous = True

    def __init__(self, tok, sampled_end: str = ""):
        super().__init__(tok, sampled_end)
        self.engine, self.fed = self, 0

    def generate_continuous(self, rows, limits, params, on_finish, num_slots, feed=None):
        rows, limits = list(rows), list(limits)
        queue, running = list(range(len(rows))), {}
        while True:
            while queue and len(running) < num_slots:
                running[queue.pop(0)] = []
            stop = False
            for i in list(running):
                new, reason = self.next_tokens(rows[i] + running[i], 1)
                running[i] += new
                if reason == "stop" or len(running[i]) >= limits[i]:
                    got = running.pop(i)
                    stop |= on_finish(i, Response(got, self.logprobs(rows[i], len(got)), reason))
            if stop:
                break
            if feed is not None:
                new_rows, stop = feed.poll(block=not running and not queue)
                queue += range(len(rows), len(rows) + len(new_rows))
                self.fed += len(new_rows)
                rows += [r for r, _ in new_rows]
                limits += [m for _, m in new_rows]
                if stop:
                    break
            if not running and not queue and not (feed is not None and feed.waiting()):
                break
        return {i: Response(t, self.logprobs(rows[i], len(t)), "abort") for i, t in running.items()}


def config(round_tokens: int = 8):
    return types.SimpleNamespace(
        rollout=types.SimpleNamespace(n=2, max_response_length=200),
        async_training=types.SimpleNamespace(partial_rollout=True, staleness_threshold=1, round_tokens=round_tokens,
                                             continuous=True, max_num_seqs=0))


class Prompts:
    def __init__(self):
        self.next = 1

    def batch(self):
        rows = [Row((p, 7, 7)) for p in (self.next, self.next + 1)]
        self.next += 2
        return rows


@pytest.mark.parametrize("turn_end", ["template", "sampled"])
@pytest.mark.parametrize("engine_cls", [RoundsEngine, ContinuousEngine])
def test_a_sample_waiting_on_a_slow_tool_blocks_nobody_and_trains_as_the_synchronous_mode_would(tok, engine_cls,
                                                                                               turn_end):
    """turn_end=sampled: turn 1 runs to the policy's own <|im_end|> (a stop token that does not end the sample)."""
    sampled_end = "<|im_end|>" if turn_end == "sampled" else ""
    engine, executor = engine_cls(tok, sampled_end), GatedExecutor({f"{SLOW}+1"})
    env = dataclasses.replace(tool_env(tok, executor, max_turns=3), sampled_end=sampled_end,
                              stop_strings=() if sampled_end else ("</tool_call>",))
    partial = PartialRollouts(config(), pad_id=tok.pad_id, engine=engine, env=env)
    assert partial.continuous == (engine_cls is ContinuousEngine)
    prompts = Prompts()
    first, batch, report = partial.generate(engine, prompts.batch, PARAMS, step=0)
    # prompts 1-4 are in flight; 3's samples wait on their tool, and the step trains 1 and 2 without waiting
    assert [r.prompt_ids[0] for r in first] == [1, 2] and executor.held
    assert report["async/samples_waiting_on_tools_total"][0] == 2
    check_rows(tok, engine, first, batch, versions_at={p: (0, 0) for p in (1, 2)})
    if engine_cls is ContinuousEngine:
        assert engine.fed >= 4, "samples back from a fast tool joined the running call"
    executor.release()
    engine.version = 1
    second, batch, report = partial.generate(engine, prompts.batch, PARAMS, step=1)
    # prompt 3 (turn 1 at version 0, turn 2 at version 1) and 4 (done at step 0, or finished now)
    assert [r.prompt_ids[0] for r in second] == [3, 4]
    check_rows(tok, engine, second, batch, versions_at={3: (0, 1)})
    assert report["async/staleness_max"][0] == 1.0


def check_rows(tok, engine, prompts, batch, versions_at: dict) -> None:
    """Every row is its prompt's full script: the tool turn has loss mask 0 and log-prob 0; the two assistant
    turns are spans; one tool call; `versions_at[p]` = the versions of turn 1 and turn 2 (from the log-probs)."""
    for i in range(batch.tokens.size(0)):
        p = prompts[i // 2].prompt_ids[0]
        first, delta, second = engine.turns(p)
        start, n = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        assert batch.tokens[i, start:start + n].tolist() == first + delta + second
        mask = batch.loss_mask[i, start:start + n].tolist()
        assert mask == [True] * len(first) + [False] * len(delta) + [True] * len(second)
        assert not batch.loss_mask[i, :start].any() and not batch.loss_mask[i, start + n:].any()
        a, b = start + len(first), start + len(first) + len(delta)
        assert batch.turns.spans[i] == [(start, a), (b, start + n)]
        assert batch.turns.tool_calls[i] == 1 and batch.turns.tool_errors[i] == 0
        assert batch.finish_reasons[i] == "stop"
        lp = batch.rollout_logprobs[i]
        assert lp[a:b].eq(0).all()
        if p in versions_at:
            v1, v2 = versions_at[p]
            torch.testing.assert_close(lp[start:a], torch.tensor([-(k + 1) / 100 - v1 / 1000
                                                                  for k in range(len(first))]))
            torch.testing.assert_close(lp[b], torch.tensor(-(b - start + 1) / 100 - v2 / 1000))


def test_a_tool_turn_that_does_not_fit_ends_the_sample_at_its_budget(tok):
    """Budget 30: turn 1 fits, its tool turn does not: the sample ends there ("length") on a policy token."""
    engine, executor = RoundsEngine(tok), GatedExecutor(set())
    env = dataclasses.replace(tool_env(tok, executor, max_turns=3), stop_strings=("</tool_call>",))
    first = len(engine.turns(1)[0])
    cfg = config(round_tokens=0)
    cfg.rollout.max_response_length = first + 2
    partial = PartialRollouts(cfg, pad_id=tok.pad_id, engine=engine, env=env)
    rows, batch, _ = partial.generate(engine, Prompts().batch, dataclasses.replace(PARAMS, max_new_tokens=first + 2),
                                      step=0)
    assert batch.response_lengths.tolist() == [first] * 4 and batch.finish_reasons == ["length"] * 4
    assert batch.turns.tool_calls == [1] * 4 and batch.loss_mask.sum() == 4 * first
