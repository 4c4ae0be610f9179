"""One multi-turn sample as it grows, and the `RolloutBatch` built from all of them.

A trajectory is its prompt ids, then response ids in the order they were appended: each assistant turn's
sampled ids as the engine returned them (loss mask 1, the engine's log-probs), each tool turn's template
and result ids (loss mask 0, log-prob 0, never read). The whole response stays within `budget` tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rlhf_mcore.rollout.routing_record import stack_rows
from rlhf_mcore.rollout.types import RolloutBatch, TurnInfo


@dataclasses.dataclass
class Trajectory:
    prompt: list[int]
    budget: int  # response tokens allowed in all (rollout.max_response_length)
    response: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)  # 1 = sampled by the policy
    logprobs: list[float] = dataclasses.field(default_factory=list)
    spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # assistant turns, token columns
    finish_reason: str = ""  # "" while running, then "stop" | "length"
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    # R3 (actor.router_replay=R3): the experts of the last call on this row [prompt + response, L, k]. Each call
    # continues the row from its exact prefix, so its prefill re-routes every earlier token (tool turns included):
    # the last call's routing covers the whole row, which ends on a sampled token.
    routing: Any = dataclasses.field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def prefix(self) -> list[int]:
        """The exact token prefix the next assistant turn continues."""
        return self.prompt + self.response

    @property
    def remaining(self) -> int:
        return self.budget - len(self.response)

    def add_turn(self, ids: list[int], logprobs: list[float]) -> list[int]:
        """Append one assistant turn's sampled ids (cut to the budget); returns the ids kept."""
        ids, logprobs = ids[:self.remaining], logprobs[:self.remaining]
        start = len(self.prompt) + len(self.response)
        self.response += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs
        self.spans.append((start, start + len(ids)))
        return ids

    def add_observation(self, ids: list[int]) -> bool:
        """Append tool-turn ids (mask 0) when they leave room for at least one more sampled token; else end the
        trajectory at the budget ("length") without them, so it ends on a policy token."""
        if len(ids) >= self.remaining:
            self.finish_reason = "length"
            return False
        self.response += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        return True


def assemble(trajectories: list[Trajectory], pad_id: int, device) -> RolloutBatch:
    """Row i = trajectory i: prompt then response from column 0, right-padded with pad_id.

    >>> t = Trajectory([5, 6], budget=8)
    >>> _ = t.add_turn([7, 8], [-0.5, -1.0]); _ = t.add_observation([9]); _ = t.add_turn([3], [-2.0])
    >>> t.finish_reason = "stop"
    >>> b = assemble([t], pad_id=0, device="cpu")
    >>> b.tokens.tolist(), b.loss_mask.int().tolist(), b.rollout_logprobs.tolist()
    ([[5, 6, 7, 8, 9, 3]], [[0, 0, 1, 1, 0, 1]], [[0.0, 0.0, -0.5, -1.0, 0.0, -2.0]])
    >>> b.response_lengths.tolist(), b.turns.spans, b.turns.num_turns
    ([4], [[(2, 4), (5, 6)]], [2])
    """
    width = max((len(t.prompt) + len(t.response) for t in trajectories), default=0)
    rows = len(trajectories)
    tokens = torch.full((rows, width), pad_id, dtype=torch.long)
    logprobs = torch.zeros(rows, width, dtype=torch.float32)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for i, t in enumerate(trajectories):
        p, end = len(t.prompt), len(t.prompt) + len(t.response)
        tokens[i, :end] = torch.tensor(t.prompt + t.response, dtype=torch.long)
        logprobs[i, p:end] = torch.tensor(t.logprobs, dtype=torch.float32)
        mask[i, p:end] = torch.tensor(t.mask, dtype=torch.bool)
    routed = None
    if trajectories and all(t.routing is not None for t in trajectories):  # R3
        routed = stack_rows([t.routing for t in trajectories], width).to(device)
    turns = TurnInfo(spans=[list(t.spans) for t in trajectories], tool_calls=[t.tool_calls for t in trajectories],
                     tool_errors=[t.tool_errors for t in trajectories],
                     tool_timeouts=[t.tool_timeouts for t in trajectories])
    return RolloutBatch(
        tokens=tokens.to(device),
        prompt_lengths=torch.tensor([len(t.prompt) for t in trajectories], dtype=torch.long, device=device),
        response_lengths=torch.tensor([len(t.response) for t in trajectories], dtype=torch.long, device=device),
        rollout_logprobs=logprobs.to(device), finish_reasons=[t.finish_reason or "stop" for t in trajectories],
        loss_mask=mask.to(device), turns=turns, routed_experts=routed)
