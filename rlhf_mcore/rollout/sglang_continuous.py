"""Continuous batching through the embedded SGLang engine: abort and continue (partial rollouts).

`decode(server, rows, limits, ...)` sends rows as requests on the engine's own event loop (`server.loop`, where
`sglang.Engine.generate` runs too), at most `num_slots` in flight, oldest first. A request's slot goes to the next
row as soon as it returns. Each finished row is handed to `on_finish(row, Response)` at once; when that returns True,
every request still running is aborted (`tokenizer_manager.abort_request(abort_all=True)`). SGLang then answers
each one with what it has decoded so far (its output ids and their log-probs, finish reason "abort"), and those rows
are returned, cut where they are, to be continued later from that exact prefix: the continuation is a new request
whose input is prompt + the tokens so far, decoded with the weights of the moment (its prefix cache was flushed at
the weight refresh). A request that SGLang finished before the abort reached it is a finished row like any other.

A `feed` (`rlhf_mcore.rollout.continuous.Feed`) may add rows while the call runs (multi-turn samples back from their
tools); it is polled whenever a request returns, and waited on when none is in flight. Stop strings are applied to
each response as the synchronous path does (after generation: the engine runs without a tokenizer).
"""
from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Callable

from rlhf_mcore.rollout.responses import Response

POLL_S = 0.005  # with a feed: how often a wait for requests also looks for fed rows


def event_loop(server) -> asyncio.AbstractEventLoop:
    """The loop the engine's tokenizer manager runs on (sglang.Engine keeps it as `.loop`)."""
    loop = getattr(server, "loop", None)
    return loop if loop is not None else asyncio.get_event_loop()


def aborted(error: BaseException) -> bool:
    """An abort that reached the request before it was sent to the scheduler (sglang 0.5.17 raises
    RequestAbortedError, a ValueError, with no output)."""
    return type(error).__name__ == "RequestAbortedError"


def decode(server, rows: list[list[int]], limits: list[int], sampling: Callable[[int], dict],
           to_response: Callable[[dict], Response], on_finish, num_slots: int, feed=None) -> dict[int, Response]:
    """Decode `rows` (rows[i] may add limits[i] tokens; `sampling(limit)` gives a request's sampling parameters)
    through at most `num_slots` requests in flight; see the module doc. The rows cut at the stop, by row."""
    return event_loop(server).run_until_complete(
        _decode(server, list(rows), list(limits), sampling, to_response, on_finish, num_slots, feed))


async def _decode(server, rows, limits, sampling, to_response, on_finish, num_slots, feed) -> dict[int, Response]:
    queue = collections.deque(range(len(rows)))
    running: dict[asyncio.Task, int] = {}

    def submit() -> None:
        while queue and len(running) < num_slots:
            i = queue.popleft()
            task = asyncio.ensure_future(server.async_generate(
                input_ids=rows[i], sampling_params=sampling(limits[i]), return_logprob=True, rid=uuid.uuid4().hex))
            running[task] = i

    def fed(block: bool) -> bool:
        if feed is None:
            return False
        new, stop = feed.poll(block)
        queue.extend(range(len(rows), len(rows) + len(new)))
        rows.extend(r for r, _ in new)
        limits.extend(m for _, m in new)
        return stop

    submit()
    stop = False
    while not stop:
        if not running:
            if feed is None or not feed.waiting():
                break
            stop = fed(block=True)
            submit()
            continue
        timeout = POLL_S if feed is not None else None
        done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            stop |= bool(on_finish(running.pop(task), to_response(task.result())))
        stop = stop or fed(block=False)
        if not stop:
            submit()
    return await _abort(server, running, to_response, on_finish)


async def _abort(server, running: dict, to_response, on_finish) -> dict[int, Response]:
    """Abort every request in flight; the rows SGLang cut, with what they decoded so far (a request that finished
    first goes to `on_finish`)."""
    if not running:
        return {}
    server.tokenizer_manager.abort_request(abort_all=True)
    results = await asyncio.gather(*running, return_exceptions=True)
    cut: dict[int, Response] = {}
    for (task, i), result in zip(running.items(), results):
        if isinstance(result, BaseException):
            if not aborted(result):
                raise result
            cut[i] = Response([], [], "abort")
            continue
        response = to_response(result)
        if response.finish_reason == "abort":
            cut[i] = response
        else:
            on_finish(i, response)
    return cut
