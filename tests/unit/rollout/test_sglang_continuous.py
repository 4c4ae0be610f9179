"""Abort and continue through the embedded SGLang engine (rollout/sglang_continuous.py), around an asyncio stand-in
that answers as sglang 0.5.17's offline Engine does: `async_generate` on the engine's own loop, one token per tick,
and `tokenizer_manager.abort_request(abort_all=True)` makes every request in flight return what it decoded so far
(finish reason "abort", the tokens in its log-prob pairs; its output_ids may lag), or raise RequestAbortedError when
it had not started. Rows end and are reported as they finish, never more than num_slots are in flight, a stopped
call returns its running rows cut at an exact prefix, and continuing them gives the full responses. The same
driver runs sglang itself on a GPU (tools/gpu)."""
from __future__ import annotations

import asyncio

import pytest

from rlhf_mcore.rollout import sglang_continuous
from rlhf_mcore.rollout.responses import Response
from rlhf_mcore.rollout.sglang_engine import cut_at_stop_string, to_response

STOP, PROMPT = 0, 2  # a row is [total length, salt] + the tokens decoded so far


class RequestAbortedError(ValueError):
    """sglang 0.5.17's error for a request aborted before it reached the scheduler."""


def full(row: list[int]) -> list[int]:
    """The whole response of a row: row[0] tokens, the last one STOP."""
    return [STOP if t == row[0] - 1 else 100 * row[1] + t for t in range(row[0])]


class StandIn:
    def __init__(self, lag_output_ids: bool = True):
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = self
        self.aborting, self.in_flight, self.most, self.requests = False, 0, 0, []
        self.lag = lag_output_ids

    def abort_request(self, rid: str = "", abort_all: bool = False):
        assert abort_all
        self.aborting = True

    async def async_generate(self, input_ids, sampling_params, return_logprob, rid):
        assert return_logprob and rid
        self.requests.append((list(input_ids), sampling_params["max_new_tokens"]))
        if self.aborting:
            raise RequestAbortedError("aborted before it was sent")
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        done = list(input_ids[PROMPT:])
        want = full(input_ids[:PROMPT])[len(done):]
        out, reason = [], "length"
        try:
            while len(out) < sampling_params["max_new_tokens"]:
                await asyncio.sleep(0)
                if self.aborting:
                    reason = "abort"
                    break
                out.append(want[len(out)])
                if out[-1] == STOP:
                    reason = "stop"
                    break
        finally:
            self.in_flight -= 1
        pairs = [(-(len(done) + k + 1) / 100, t, None) for k, t in enumerate(out)]
        ids = out[:-1] if reason == "abort" and self.lag else out  # a non-streamed abort's output_ids may lag
        return {"output_ids": ids, "meta_info": {"finish_reason": {"type": reason}, "output_token_logprobs": pairs}}


def run(server, rows, limits, num_slots, stop_after=None, feed=None):
    ended = {}

    def on_finish(i, response):
        ended[i] = response
        return stop_after is not None and len(ended) >= stop_after
    cut = sglang_continuous.decode(server, rows, limits, lambda limit: {"max_new_tokens": limit}, to_response,
                                   on_finish, num_slots, feed)
    return ended, cut


def rows_of(lengths):
    return [[n, k + 1] for k, n in enumerate(lengths)]


def test_rows_end_as_they_finish_through_at_most_num_slots_requests():
    lengths = [3, 9, 2, 7, 4, 6, 5]
    server = StandIn()
    ended, cut = run(server, rows_of(lengths), [20] * 7, num_slots=3)
    assert cut == {} and server.most == 3
    for i, n in enumerate(lengths):
        assert ended[i] == Response(full([n, i + 1]), [-(k + 1) / 100 for k in range(n)], "stop")
    started = [r[0][0] for r in server.requests]
    assert started[:3] == lengths[:3]  # the oldest first; row 3 took the slot of the first to end


def test_a_stopped_call_aborts_the_rest_and_cut_rows_continue_from_their_exact_prefix():
    lengths = [12, 2, 10, 6, 11, 9]
    rows = rows_of(lengths)
    server = StandIn()
    ended, cut = run(server, rows, [30] * 6, num_slots=4, stop_after=2)
    # rows 1 and 3 end first; row 4 took row 1's slot; row 5 never started and is neither ended nor cut
    assert sorted(ended) == [1, 3] and set(cut) == {0, 2, 4}
    for i, response in cut.items():
        whole = full(rows[i])
        assert response.finish_reason == "abort" and 0 < len(response.tokens) < len(whole)
        assert response.tokens == whole[:len(response.tokens)]  # from the log-prob pairs: output_ids lag by one
        assert response.logprobs == [-(k + 1) / 100 for k in range(len(response.tokens))]
    again, _ = run(StandIn(), [rows[i] + cut[i].tokens for i in cut], [30 - len(cut[i].tokens) for i in cut], 4)
    for j, i in enumerate(cut):
        assert cut[i].tokens + again[j].tokens == full(rows[i])
        assert again[j].logprobs[0] == -(len(cut[i].tokens) + 1) / 100  # positions go on from the prefix


def test_a_request_aborted_before_it_started_is_cut_with_no_tokens():
    """The stand-in takes 3 ticks to send a request to its scheduler: row 2 is submitted when row 1 ends, and the
    stop (row 0 ends a tick later) aborts it before it is sent (sglang raises RequestAbortedError)."""
    class SlowStart(StandIn):
        async def async_generate(self, **kw):
            for _ in range(3):
                await asyncio.sleep(0)
            return await super().async_generate(**kw)
    ended, cut = run(SlowStart(), rows_of([5, 2, 5]), [9] * 3, num_slots=2, stop_after=2)
    assert sorted(ended) == [0, 1] and cut == {2: Response([], [], "abort")}


def test_limits_and_stop_strings_end_rows():
    server = StandIn()
    decode = lambda ids: "".join("x" if t % 100 == 3 else "." for t in ids)  # noqa: E731 - position 3 spells "x"

    def response(out):
        return cut_at_stop_string(to_response(out), ("x",), decode)
    ended = {}
    cut = sglang_continuous.decode(server, rows_of([8, 2, 8]), [5, 5, 2], lambda m: {"max_new_tokens": m}, response,
                                   lambda i, r: ended.setdefault(i, r) and False, 2)
    assert cut == {}
    assert [(len(ended[i].tokens), ended[i].finish_reason) for i in range(3)] == [(4, "stop"), (2, "stop"),
                                                                                 (2, "length")]


class Later:
    """A feed: rows join one at a time, each after a row has ended (or at once when nothing is in flight)."""

    def __init__(self, rows, ended):
        self.rows, self.ended, self.given, self.bounds = rows, ended, 0, (0, 0)

    def waiting(self):
        return self.given < len(self.rows)

    def poll(self, block):
        if self.given < len(self.rows) and (block or len(self.ended) > self.given):
            self.given += 1
            return [(self.rows[self.given - 1], 20)], False
        return [], False


def test_fed_rows_join_the_running_call():
    ended = {}
    feed = Later(rows_of([4, 2, 3]), ended)
    cut = sglang_continuous.decode(StandIn(), rows_of([5, 7]), [20, 20], lambda m: {"max_new_tokens": m}, to_response,
                                   lambda i, r: ended.setdefault(i, r) and False, 2, feed)
    assert cut == {} and sorted(ended) == [0, 1, 2, 3, 4]
    assert [ended[i].tokens for i in (2, 3, 4)] == [full(r) for r in rows_of([4, 2, 3])]


def test_an_error_other_than_an_abort_is_raised():
    class Broken(StandIn):
        async def async_generate(self, **kw):
            raise RuntimeError("scheduler died")
    with pytest.raises(RuntimeError, match="scheduler died"):
        run(Broken(), rows_of([3]), [5], 1)
