"""Partial rollouts: a step never waits for its longest sample (`async_training.partial_rollout`).

`staleness_threshold` + 1 batches of groups are in flight. A step's rollout decodes in rounds of `round_tokens`
tokens. Each round continues every unfinished sample from its exact token prefix (prompt + response so far), with
the weights of the moment, through the engine's usual `generate` (n = 1 per sample). The step stops once it holds
one batch of complete groups (all n samples of a prompt finished) and no unfinished group is at its last allowed
version, and trains on that batch, the oldest groups first. What is still unfinished is carried into the next step's
rollout with its tokens and per-token behaviour log-probs, and a new batch of prompts joins it. A sample therefore
finishes within `staleness_threshold` + 1 steps of its first token and is never passed over for being long.

Every response token records the policy version that sampled it (the step whose weights decoded it).
`async_training.staleness_threshold` bounds how many versions a token may lag the weights it trains under: a
sample that would still exceed it (one carried across a change of the bound) is dropped and regenerated from its
prompt (counted). The PPO ratio then uses the log-probs recomputed at the current weights, and the importance
weight between those and the behaviour log-probs is `actor.rollout_correction` (decoupled PPO:
`trainer.phases.rollout_correction`).

Carried samples are dropped when a checkpoint is written (counted), in a run that goes on as in one that resumes
from it: resume stays bitwise, and a checkpoint holds no half-decoded samples.

`PartialPool` is the bookkeeping alone (pure, no engine); `rlhf_mcore.trainer.partial_rollout` drives it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from rlhf_mcore.rollout.types import RolloutBatch, TurnInfo


@dataclasses.dataclass
class Sample:
    tokens: list[int] = dataclasses.field(default_factory=list)  # response tokens so far
    logprobs: list[float] = dataclasses.field(default_factory=list)  # behaviour log-prob of each token
    versions: list[int] = dataclasses.field(default_factory=list)  # policy version of each token (-1: a tool's)
    finish_reason: str = ""  # "" while unfinished, then "stop" | "length"
    key: int = 0  # the pool's name for it, the same on every rank of the replica (new at each reset)
    # multi-turn (`rlhf_mcore.rollout.partial_turns`): 0 on tool-turn tokens, the turns, and the tool calls
    mask: list[int] = dataclasses.field(default_factory=list)
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # assistant turns, response offsets
    turn_start: int = 0  # where the open assistant turn began (response offset)
    waiting: bool = False  # its turn's tool calls are running
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    # R3 (actor.router_replay=R3): the experts of the last round that decoded it, [prompt + tokens, L, k]. A round
    # continues the row from its exact prefix, so its prefill routes every earlier token again, at that round's
    # weights: the last round's routing covers the whole row, as one generate() call's does.
    routing: Any = None

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def reset(self, key: int = 0) -> None:
        self.__init__(key=key)

    def add(self, tokens: list[int], logprobs: list[float], version: int, stopped: bool, max_length: int) -> None:
        """Append tokens sampled by policy `version` (cut to `max_length` in all); the sample ends if `stopped` or at
        `max_length` tokens."""
        room = max_length - len(self.tokens)
        tokens, logprobs = tokens[:room], logprobs[:room]
        self.tokens += tokens
        self.logprobs += logprobs
        self.versions += [version] * len(tokens)
        self.mask += [1] * len(tokens)
        if stopped:
            self.finish_reason = "stop"
        elif len(self.tokens) >= max_length:
            self.finish_reason = "length"

    def end_turn(self) -> None:
        """The open assistant turn ends here (its span is kept)."""
        self.spans.append((self.turn_start, len(self.tokens)))
        self.turn_start = len(self.tokens)

    def observe(self, ids: list[int], max_length: int) -> bool:
        """Append a tool turn's ids (mask 0) when they leave room for one more sampled token; else end the sample
        at its budget ("length") without them, so that it ends on a policy token. Whether they were appended."""
        if len(self.tokens) + len(ids) >= max_length:
            self.finish_reason = "length"
            return False
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        self.mask += [0] * len(ids)
        self.turn_start = len(self.tokens)
        return True


@dataclasses.dataclass
class Group:
    prompt: Any  # the prompt row (`.prompt_ids`)
    samples: list[Sample]
    born: int  # the step that drew the prompt (older groups train first)

    @property
    def complete(self) -> bool:
        return all(s.done for s in self.samples)

    def oldest_version(self) -> int | None:
        return min((v for s in self.samples for v in s.versions[:1]), default=None)


def max_lag(staleness_threshold: float) -> int:
    """Versions a token may lag: verl's threshold rounded up (an integer is taken as it is).

    >>> max_lag(1), max_lag(0.5), max_lag(0)
    (1, 1, 0)
    """
    return math.ceil(staleness_threshold)


def auto_round_tokens(max_response_length: int) -> int:
    """The largest divisor of `max_response_length` that is at most a quarter of it (at least 1).

    >>> auto_round_tokens(256), auto_round_tokens(1024), auto_round_tokens(10), auto_round_tokens(3)
    (64, 256, 2, 1)
    """
    quarter = max(1, max_response_length // 4)
    return max(d for d in range(1, quarter + 1) if max_response_length % d == 0)


class PartialPool:
    """The groups in flight on this DP rank: those carried from earlier steps and this step's new ones."""

    def __init__(self, n: int, max_response_length: int, lag: int):
        self.n, self.max_response_length, self.lag = n, max_response_length, lag
        self.groups: list[Group] = []
        self.keys = 0  # samples named so far

    def new_key(self) -> int:
        self.keys += 1
        return self.keys

    def admit(self, prompts: list, step: int) -> None:
        self.groups += [Group(p, [Sample(key=self.new_key()) for _ in range(self.n)], step) for p in prompts]

    def drop_stale(self, version: int) -> int:
        """Reset the samples whose oldest token would lag more than `lag` versions behind `version` (the
        weights this step trains); the number reset."""
        dropped = 0
        for group in self.groups:
            for sample in group.samples:
                if sample.versions and version - sample.versions[0] > self.lag:
                    sample.reset(self.new_key())  # a tool result still due for the old key is ignored
                    dropped += 1
        return dropped

    def active(self) -> list[tuple[Any, Sample]]:
        """(prompt, sample) of every unfinished sample, oldest group first."""
        return [(g.prompt, s) for g in self.groups for s in g.samples if not s.done]

    def num_complete(self) -> int:
        return sum(g.complete for g in self.groups)

    def urgent(self, version: int) -> bool:
        """Whether an unfinished group has tokens that would lag more than `lag` at the next version: it must
        finish in this step, so that a long sample is never passed over until it goes stale."""
        return bool(self.urgent_groups(version))

    def urgent_groups(self, version: int) -> list[Group]:
        """The unfinished groups that must finish at `version` (see `urgent`)."""
        return [g for g in self.groups if not g.complete and g.oldest_version() is not None
                and version + 1 - g.oldest_version() > self.lag]

    def take_complete(self, k: int) -> list[Group]:
        """Remove and return the `k` oldest complete groups (fewer if there are fewer)."""
        done = sorted((g for g in self.groups if g.complete), key=lambda g: g.born)[:k]
        taken = {id(g) for g in done}
        self.groups = [g for g in self.groups if id(g) not in taken]
        return done

    def clear(self) -> int:
        """Drop every group in flight (a checkpoint is written); the number of samples dropped."""
        dropped = sum(len(g.samples) for g in self.groups)
        self.groups = []
        return dropped

    def carried(self) -> int:
        return sum(len(g.samples) for g in self.groups)


class StopRule:
    """When a step's continuous rollout may stop: `need` complete groups in the pool and no urgent group left
    unfinished. Kept up to date one finished sample at a time (`finished`), without scanning the pool. A group is
    counted once, however many of its samples are reported after it completed (multi-turn: several samples of a
    group can end in one poll of their tool results, each reported once all of them are marked ended)."""

    def __init__(self, pool: PartialPool, need: int, version: int):
        self.group_of = {id(s): g for g in pool.groups for s in g.samples}
        self.complete, self.need = {id(g) for g in pool.groups if g.complete}, need
        self.urgent = {id(g) for g in pool.urgent_groups(version)}

    def finished(self, sample: Sample) -> bool:
        """`sample` has just ended; whether the step has what it needs now."""
        group = self.group_of[id(sample)]
        if group.complete:
            self.complete.add(id(group))
            self.urgent.discard(id(group))
        return self.satisfied()

    def satisfied(self) -> bool:
        return len(self.complete) >= self.need and not self.urgent


def to_rollout_batch(groups: list[Group], pad_id: int, device=None,
                     multi_turn: bool = False) -> tuple[RolloutBatch, torch.Tensor]:
    """The engine contract's batch of complete `groups` (row i = sample i % n of group i // n) on `device` (where
    the engines put theirs) and the [B, S] long tensor of each token's policy version (-1 outside the sampled
    tokens). `multi_turn`: the loss mask is 0 on tool turns, and the batch has the rows' turns (`TurnInfo`)."""
    rows = [(g.prompt, s) for g in groups for s in g.samples]
    width = max(len(p.prompt_ids) + len(s.tokens) for p, s in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    logprobs = torch.zeros(len(rows), width, dtype=torch.float32)
    versions = torch.full((len(rows), width), -1, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (prompt, sample) in enumerate(rows):
        p, r = len(prompt.prompt_ids), len(sample.tokens)
        tokens[i, :p] = torch.tensor(prompt.prompt_ids, dtype=torch.long)
        tokens[i, p:p + r] = torch.tensor(sample.tokens, dtype=torch.long)
        logprobs[i, p:p + r] = torch.tensor(sample.logprobs, dtype=torch.float32)
        versions[i, p:p + r] = torch.tensor(sample.versions, dtype=torch.long)
        if multi_turn:
            mask[i, p:p + r] = torch.tensor(sample.mask, dtype=torch.bool)
    prompt_lengths = [len(p.prompt_ids) for p, _ in rows]
    routed = None
    if all(s.routing is not None for _, s in rows):  # R3
        from rlhf_mcore.rollout.routing_record import stack_rows

        routed = stack_rows([s.routing for _, s in rows], width).to(device)
    turns = TurnInfo(spans=[[(p + a, p + b) for a, b in s.spans] for p, (_, s) in zip(prompt_lengths, rows)],
                     tool_calls=[s.tool_calls for _, s in rows], tool_errors=[s.tool_errors for _, s in rows],
                     tool_timeouts=[s.tool_timeouts for _, s in rows]) if multi_turn else None
    batch = RolloutBatch(tokens=tokens.to(device), prompt_lengths=torch.tensor(prompt_lengths, device=device),
                         response_lengths=torch.tensor([len(s.tokens) for _, s in rows], device=device),
                         rollout_logprobs=logprobs.to(device), finish_reasons=[s.finish_reason for _, s in rows],
                         loss_mask=mask.to(device) if multi_turn else None, turns=turns, routed_experts=routed)
    return batch, versions.to(device)


def staleness_metrics(versions: torch.Tensor, loss_mask: torch.Tensor, version: int) -> dict[str, float]:
    """Lag of the trained tokens behind `version`: mean, max, and the fraction of tokens with any lag.

    >>> v = torch.tensor([[-1, 3, 3, 4], [-1, 4, 4, -1]]); m = v >= 0
    >>> staleness_metrics(v, m, 4)
    {'async/staleness_mean': 0.4, 'async/staleness_max': 1.0, 'async/off_policy_token_frac': 0.4}
    """
    lag = (version - versions[loss_mask]).double()
    if lag.numel() == 0:
        return {"async/staleness_mean": 0.0, "async/staleness_max": 0.0, "async/off_policy_token_frac": 0.0}
    return {"async/staleness_mean": float(lag.mean()), "async/staleness_max": float(lag.max()),
            "async/off_policy_token_frac": float((lag > 0).double().mean())}
