"""Response bookkeeping of a decode loop and the final `RolloutBatch` layout.

While decoding, every still-running row has the same response length (one token per step), so a
[rows, max_new] buffer plus a per-row final length is all the state there is.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from rlhf_mcore.rollout.routing_record import stack_rows
from rlhf_mcore.rollout.stopping import finish_reason
from rlhf_mcore.rollout.types import RolloutBatch


@dataclasses.dataclass
class Response:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    routing: Optional[torch.Tensor] = dataclasses.field(default=None, repr=False)  # [tokens, L, k] experts (R3)


@dataclasses.dataclass
class ResponseBuffer:
    tokens: torch.Tensor  # [N, max_new] long, pad_id where not generated
    logprobs: torch.Tensor  # [N, max_new] fp32
    lengths: torch.Tensor  # [N] long, set when a row finishes
    stopped: torch.Tensor  # [N] bool, True when a stop token / string ended the row

    @classmethod
    def empty(cls, num_rows: int, max_new_tokens: int, pad_id: int, device) -> "ResponseBuffer":
        return cls(
            tokens=torch.full((num_rows, max_new_tokens), pad_id, dtype=torch.long, device=device),
            logprobs=torch.zeros(num_rows, max_new_tokens, dtype=torch.float32, device=device),
            lengths=torch.zeros(num_rows, dtype=torch.long, device=device),
            stopped=torch.zeros(num_rows, dtype=torch.bool, device=device),
        )

    def record(self, rows: torch.Tensor, step: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Token number `step` (0-based) of each row in `rows` ([n] long)."""
        self.tokens[rows, step] = tokens
        self.logprobs[rows, step] = logprobs

    def finish(self, rows: torch.Tensor, step: int, stopped: bool) -> None:
        """`rows` end with their token number `step`."""
        self.lengths[rows] = step + 1
        self.stopped[rows] = stopped

    def tails(self, rows: torch.Tensor, step: int, new_tokens: torch.Tensor, window: int) -> list[list[int]]:
        """The last `window` response tokens of each row, with `new_tokens` as token number `step`."""
        past = self.tokens[rows, max(0, step + 1 - window):step]
        return torch.cat([past, new_tokens.unsqueeze(1)], dim=1).tolist()

    def to_responses(self) -> list[Response]:
        lengths, stopped = self.lengths.tolist(), self.stopped.tolist()
        tokens, logprobs = self.tokens.tolist(), self.logprobs.tolist()
        return [Response(tokens[i][:n], logprobs[i][:n], finish_reason(stopped[i])) for i, n in enumerate(lengths)]


def assemble_batch(prompts: list[list[int]], responses: list[Response], pad_id: int, device) -> RolloutBatch:
    """Row i = prompts[i] + responses[i] from column 0, right-padded with pad_id; log-probs at response
    positions, 0 elsewhere.

    >>> b = assemble_batch([[5, 6], [7]], [Response([8], [-0.5], "stop"), Response([9, 3], [-1.0, -2.0],
    ...                    "length")], pad_id=0, device="cpu")
    >>> b.tokens.tolist(), b.rollout_logprobs.tolist(), b.finish_reasons
    ([[5, 6, 8], [7, 9, 3]], [[0.0, 0.0, -0.5], [0.0, -1.0, -2.0]], ['stop', 'length'])
    """
    width = max((len(p) + len(r.tokens) for p, r in zip(prompts, responses)), default=0)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    logprobs = torch.zeros(len(prompts), width, dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        end = len(p) + len(r.tokens)
        tokens[i, :end] = torch.tensor(p + r.tokens, dtype=torch.long)
        logprobs[i, len(p):end] = torch.tensor(r.logprobs, dtype=torch.float32)
    routed = None
    if responses and all(r.routing is not None for r in responses):  # R3
        routed = stack_rows([r.routing for r in responses], width).to(device)
    return RolloutBatch(
        tokens=tokens.to(device),
        prompt_lengths=torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device),
        response_lengths=torch.tensor([len(r.tokens) for r in responses], dtype=torch.long, device=device),
        rollout_logprobs=logprobs.to(device),
        finish_reasons=[r.finish_reason for r in responses],
        routed_experts=routed,
    )
