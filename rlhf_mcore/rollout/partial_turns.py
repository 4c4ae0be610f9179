"""Multi-turn samples in partial rollouts (`async_training.partial_rollout` with `rollout.mode=multi_turn`): a
sample that waits on a tool blocks nobody.

When the decode of a sample's assistant turn ends (not when a step's rollout cuts it), `ToolTurns.end_turn`
decides as the synchronous mode does (`rlhf_mcore.rollout.modes.multi_turn`): the sample ends at its budget, at a
stop token, at the last allowed turn, or when the turn calls no tool. Otherwise its calls (at most
`max_tool_calls`; the rest get an error result, unrun) go to the tool executor at once, and the sample waits out
of the decode while the others decode on. `poll` hands back the samples whose calls have all returned, with their
tool turn appended (loss mask 0), or ended at the budget when it does not fit. They continue in the same call
(continuous batching) or the next round.

Tool calls run on the replica's first rank. Which samples are back is that rank's decision, broadcast with their
tool-turn ids to the replica's other ranks at each poll, so that every rank continues the same samples. A sample
still waiting when a step's rollout stops keeps waiting into the next step (its calls keep running). One that the
staleness bound resets gets a new key, and the results due for its old key are ignored.
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait

import torch.distributed as dist

from rlhf_mcore.chat import tool_delta_ids
from rlhf_mcore.rollout.modes.multi_turn import count_results, too_many_calls, tools_kwargs
from rlhf_mcore.rollout.partial import Sample


class ToolTurns:
    """The tool side of multi-turn partial rollouts on one DP replica (see the module doc)."""

    def __init__(self, env, max_length: int):
        self.env, self.max_length = env, max_length
        self.max_turns, self.max_calls = env.options.max_turns, env.options.max_tool_calls
        group = getattr(getattr(env.ctx, "pgs", None), "mp", None)
        self.group = group if group is not None and dist.is_initialized() and group.size() > 1 else None
        self.pending: dict[int, tuple[Sample, list]] = {}  # key -> (sample, its calls' futures; [] off the leader)

    @property
    def leader(self) -> bool:
        return self.env.executor is not None

    def end_turn(self, sample: Sample, extra_info, stop_ids) -> None:
        """`sample`'s assistant turn has ended at a stop token or string, or at its budget: end the sample, or run
        its tool calls and let it wait for them."""
        turn = sample.tokens[sample.turn_start:]
        sample.end_turn()
        if sample.done:  # its budget
            return
        stopped, last = bool(turn) and turn[-1] in stop_ids, len(sample.spans) >= self.max_turns
        if stopped and (not self.env.sampled_end or last):  # turn_end=sampled: a call's turn ends at a stop token
            sample.finish_reason = "stop"
            return
        if last:
            sample.finish_reason = "length"
            return
        calls = self.env.parse(self.env.tokenizer.decode(turn))
        if not calls:
            sample.finish_reason = "stop"
            return
        futures = []
        if self.leader:
            context = tools_kwargs(extra_info) or None
            futures = [self.env.executor.submit(c, context) for c in calls[:self.max_calls]]
            unrun = too_many_calls(self.max_calls, self.env.options.max_tool_response_chars)
            futures += [unrun] * max(0, len(calls) - self.max_calls)
        sample.waiting = True
        self.pending[sample.key] = (sample, futures)

    def waiting(self) -> bool:
        self._forget_reset()
        return bool(self.pending)

    def poll(self, block: bool) -> list[Sample]:
        """The samples whose tool calls have all returned, with their tool turn appended or ended at the budget
        (with `block`, waits until one has, unless none waits). Collective over the replica's ranks."""
        self._forget_reset()
        payload = [self._returned(block) if self.leader else None]
        if self.group is not None:
            dist.broadcast_object_list(payload, src=dist.get_process_group_ranks(self.group)[0], group=self.group)
        back = []
        for key, (ids, results) in payload[0].items():
            sample, _ = self.pending.pop(key)
            count_results(sample, results)
            sample.waiting = False
            sample.observe(ids, self.max_length)
            back.append(sample)
        return back

    def clear(self) -> int:
        """Forget every waiting sample (a checkpoint drops what is in flight); how many."""
        dropped, self.pending = len(self.pending), {}
        return dropped

    def _forget_reset(self) -> None:
        self.pending = {k: v for k, v in self.pending.items() if v[0].key == k}

    def _returned(self, block: bool) -> dict[int, tuple[list[int], list]]:
        """{key: (tool-turn ids, [(text, error, timed out)])} of the samples whose calls are all done (the leader)."""
        def ready() -> list[int]:
            return [k for k, (_, fs) in self.pending.items() if all(not isinstance(f, Future) or f.done() for f in fs)]
        keys = ready()
        while block and not keys and self.pending:
            wait([f for _, fs in self.pending.values() for f in fs if isinstance(f, Future) and not f.done()],
                 return_when=FIRST_COMPLETED)
            keys = ready()
        out = {}
        for k in keys:
            results = [outcome(f) for f in self.pending[k][1]]
            out[k] = (tool_delta_ids(self.env.tokenizer, [text for text, _, _ in results], self.env.sampled_end),
                      results)
        return out


def outcome(call) -> tuple[str, str | None, bool]:
    """(text, error kind, timed out) of a call's future, or the result given for a call that was not run."""
    if not isinstance(call, Future):
        return call
    r = call.result()
    return r.text, r.error, bool(r.timed_out)
