"""Continuous batching in the native engine: a slot freed by a finished sample takes the next one at once.

`decode(static, rows, limits, ...)` decodes a queue of rows (token prefixes, oldest first) through the static
decoder's `slots` cache slots. Each slot holds one row at its own position (its trainer columns) and its own
response column, so rows start and end at different steps:
- every few steps (`CHECK_EVERY`; every step with stop strings) the host reads which slots have ended (one
  sync); each ended row is handed to `on_finish(row, Response)` at once;
- once `refill_min` slots are free and rows are queued, the next rows are prefilled into those slots (an eager
  causal forward of their prefixes, keys and values copied into the slots' cache rows) while the others decode
  on; no slot waits for the longest row of its batch;
- when `on_finish` returns True the call stops and returns the rows still decoding, cut where they are
  (`finish_reason` "abort"): tokens and behaviour log-probs so far, to be continued later from that exact
  prefix (`rlhf_mcore.trainer.partial_rollout`). Queued rows that never started are not returned;
- a `feed` may add rows while the call runs (multi-turn samples back from their tools,
  `rlhf_mcore.rollout.partial_turns`): it is polled at every look, and waited on when no slot decodes;
- once the queue is empty (and the feed has nothing more to give), the running rows move to the front of the
  cache and smaller batch buckets decode them, as in the synchronous loop.

Response buffers are one per slot, not one per row: an ended row's buffer goes to the next row once its response
is read, and its slot is idled so that it no longer writes there.

A row ends at a stop token, a stop string, or at its limit (the tokens it may still add). Everything runs on the
decode step the synchronous loop captures as CUDA graphs (one graph per batch-size and length bucket), with no
change to its arithmetic: a row's tokens and log-probs are those of the synchronous loop given the same draws.
"""
from __future__ import annotations

import collections
from typing import Callable, Protocol

import torch

from rlhf_mcore.rollout import kv_cache
from rlhf_mcore.rollout.responses import Response
from rlhf_mcore.rollout.static_decode import bucket_for
from rlhf_mcore.rollout.stopping import finish_reason

OnFinish = Callable[[int, Response], bool]  # (row, its response) -> stop now


def responses(st, rows: list[int], reason: Callable[[bool], str]) -> list[Response]:
    """The response rows `rows` as Responses (finish reason `reason(stopped)`), one device read per field."""
    index = torch.tensor(rows, dtype=torch.long, device=st.out_tokens.device)
    lengths, stopped = st.out_lengths[index].tolist(), st.out_stopped[index].tolist()
    width = max(lengths, default=0)
    tokens, logprobs = st.out_tokens[index, :width].tolist(), st.out_logprobs[index, :width].tolist()
    return [Response(t[:n], p[:n], reason(s)) for t, p, n, s in zip(tokens, logprobs, lengths, stopped)]


class Slots:
    """Which row each cache slot holds, the free slots, the queue of rows waiting for one, and the response
    buffer row each running row writes (one per slot: a row's buffer is free again once its response is read)."""

    def __init__(self, num_rows: int, num_slots: int):
        self.queue = collections.deque(range(num_rows))
        self.running: dict[int, int] = {}  # slot -> row
        self.free = list(range(num_slots))
        self.buffer: dict[int, int] = {}  # running row -> its response buffer row
        self.free_buffers = list(range(num_slots))

    def take(self) -> tuple[list[int], list[int]]:
        """(slots, rows): the next queued rows, one per free slot (lowest slots first), each given a buffer row."""
        self.free.sort()
        rows = [self.queue.popleft() for _ in range(min(len(self.free), len(self.queue)))]
        slots, self.free = self.free[:len(rows)], self.free[len(rows):]
        self.running.update(zip(slots, rows))
        self.buffer.update((row, self.free_buffers.pop()) for row in rows)
        return slots, rows

    def end(self, slots: list[int]) -> list[int]:
        """The rows of `slots`, which have ended; their slots are free (their buffers once `release`d)."""
        self.free += slots
        return [self.running.pop(s) for s in slots]

    def release(self, rows: list[int]) -> None:
        """The responses of `rows` have been read: their buffer rows may take new rows."""
        self.free_buffers += [self.buffer.pop(r) for r in rows]

    def compact(self) -> list[int]:
        """Renumber the running slots 0..k-1 (in slot order); the old slots, in their new order."""
        keep = sorted(self.running)
        self.running = {new: self.running[old] for new, old in enumerate(keep)}
        self.free = []
        return keep


def prefill_groups(lengths: list[int], waste: float = 0.5) -> list[list[int]]:
    """Indices of `lengths` in prefill batches of similar length (each is right-padded to its longest): sorted by
    length, a batch closes before its padding would exceed `waste` of its real tokens.

    >>> prefill_groups([100, 3000, 120, 2900, 110])
    [[0, 4, 2], [3, 1]]
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else None
        if group and lengths[i] * (len(group) + 1) <= (1 + waste) * (sum(lengths[j] for j in group) + lengths[i]):
            group.append(i)
        else:
            groups.append([i])
    return groups


CHECK_EVERY = 4  # decode steps between looks at which rows ended (1 with stop strings: they are checked per step)


class Feed(Protocol):
    """Rows that join a running call (multi-turn: a sample whose tool results came back continues from its new
    prefix). `bounds`: (the longest prefix + limit, the largest limit) any fed row will have."""

    bounds: tuple[int, int]

    def waiting(self) -> bool:
        """Whether rows may still come."""

    def poll(self, block: bool) -> tuple[list[tuple[list[int], int]], bool]:
        """(rows ready now as (prefix, limit), stop the call now); with `block`, waits until one is ready or none
        can come any more."""


def decode(static, rows: list[list[int]], limits: list[int], params, stop_ids: torch.Tensor, on_finish: OnFinish,
           num_slots: int, pad_id: int, device, decode_text=None, refill_min: int = 0,
           check_every: int = 0, feed: Feed | None = None) -> dict[int, Response]:
    """Decode `rows` (prefixes; rows[i] may add limits[i] tokens) through `num_slots` slots; see the module doc.
    The rows cut when `on_finish` (or `feed`) stops the call, by row; {} when every row ended. The host looks at
    the slots every `check_every` steps (the steps between run back to back on the device; a row that ended
    meanwhile idles in its slot until then). Rows from `feed` are numbered after `rows`, in the order fed."""
    rows, limits = list(rows), list(limits)
    if not rows and feed is None:
        return {}
    num_slots = max(1, min(num_slots, len(rows))) if feed is None else num_slots
    refill_min = refill_min or max(1, num_slots // 16)
    check_every = 1 if params.stop_strings else check_every or CHECK_EVERY
    longest, widest = feed.bounds if feed is not None else (0, 0)
    length = max([len(r) + m for r, m in zip(rows, limits)] + [longest]) + check_every  # an ended row idles a bit
    st = static.reserve(num_slots, length, max(limits + [widest]), device, rows=num_slots)
    bucket = bucket_for(num_slots)
    st.idle(0, bucket)
    slots = Slots(len(rows), num_slots)
    running = torch.zeros(st.done.numel(), dtype=torch.bool, device=device)  # slots whose row is not reported ended

    def start() -> None:
        taken_slots, taken_rows = slots.take()
        for group in prefill_groups([len(rows[i]) for i in taken_rows]):  # little padding in each prefill
            where, which = [taken_slots[k] for k in group], [taken_rows[k] for k in group]
            prompt, lengths = kv_cache.right_pad([rows[i] for i in which], pad_id, device)
            index = slice(0, len(where)) if where == list(range(len(where))) else torch.tensor(where, device=device)
            static.refill(index, torch.tensor([slots.buffer[i] for i in which], device=device), prompt, lengths,
                          params, stop_ids, torch.tensor([limits[i] for i in which], device=device))
            running[index] = True

    def look() -> tuple[int, list[int]]:
        """(the highest position a running row feeds next, the slots whose rows ended): one host sync."""
        alive = running[:bucket] & ~st.done[:bucket]
        top = torch.where(alive, st.pos[:bucket], 0).max().view(1)
        top, *ended = torch.cat((top, (running[:bucket] & st.done[:bucket]).nonzero().squeeze(1))).tolist()
        return top, ended

    def read(which: list[int], reason: Callable[[bool], str]) -> list[Response]:
        out = responses(st, [slots.buffer[r] for r in which], reason)
        slots.release(which)
        return out

    def fed(block: bool) -> bool:
        """Queue what the feed has ready; whether it stops the call."""
        if feed is None:
            return False
        new, stop = feed.poll(block)
        slots.queue.extend(range(len(rows), len(rows) + len(new)))
        rows.extend(r for r, _ in new)
        limits.extend(m for _, m in new)
        return stop

    start()
    while True:
        if params.stop_strings:
            static.end_stop_strings(bucket, params, decode_text)
        top, ended = look()
        running[ended] = False
        if ended:
            st.idle_slots(torch.tensor(ended, device=device))  # before their buffer rows go to other rows
        stop = False
        ended_rows = slots.end(ended)
        for row, response in zip(ended_rows, read(ended_rows, finish_reason)):
            stop |= bool(on_finish(row, response))
        if stop or fed(block=not slots.running and not slots.queue):
            break
        if slots.queue and slots.free and (len(slots.free) >= refill_min or not slots.running):
            start()
            top, _ = look()
        if not slots.running:
            if feed is not None and feed.waiting():
                continue  # nothing to decode until the feed has a row: its poll blocks
            break
        if not slots.queue and (feed is None or not feed.waiting()) and bucket_for(len(slots.running)) < bucket:
            bucket = bucket_for(len(slots.running))  # decode only the running rows
            keep = torch.tensor(slots.compact(), device=device)
            st.compact(keep, bucket)
            running[:bucket] = False
            running[:keep.numel()] = True
        for _ in range(check_every):
            static.step(bucket, params, stop_ids, needed=top + 1)
            top += 1
    cut = list(slots.running.values())
    return dict(zip(cut, read(cut, lambda stopped: "abort")))
