"""What every rollout engine takes and returns."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    stop_token_ids: tuple[int, ...] = ()  # EOS and friends; the stop token is kept in the response
    stop_strings: tuple[str, ...] = ()  # checked on the decoded response; the response ends after the match
    seed: int = 0  # sampling seed; identical on the TP/PP ranks of one DP replica


@dataclasses.dataclass
class RolloutBatch:
    """One rank's samples. Row i = sample (i % n) of prompt (i // n) of this rank's prompts."""

    tokens: torch.Tensor  # [B, S] long: prompt then response, right-padded with pad_id
    prompt_lengths: torch.Tensor  # [B] long
    response_lengths: torch.Tensor  # [B] long
    rollout_logprobs: torch.Tensor  # [B, S] fp32: engine log-prob of tokens[:, t] (0 outside the response)
    finish_reasons: list[str]  # "stop" | "length", one per row
    # [B, S] bool: True on the tokens the policy sampled (what losses, KL, entropy, advantages and metrics use);
    # None = every response token (single turn): filled in as `response_mask`. Multi-turn rollouts set it
    # (0 on tool output and template tokens between assistant turns).
    loss_mask: Optional[torch.Tensor] = None
    turns: Optional["TurnInfo"] = None  # multi-turn rollouts: per-row turns and tool statistics
    # [B, S, L, k] the top-k experts each token was routed to in this rank's L MoE layers while sampling (R3,
    # actor.router_replay=R3; experts 0..k-1 on padding and each row's last token); None otherwise
    routed_experts: Optional[torch.Tensor] = None
    # a vision LM's rows' images (`models.vision_step.stack_row_images`): pixel_values [B, P_max, D] and
    # image_grid_thw [B, I_max, 3], zero-padded; None without images
    pixel_values: Optional[torch.Tensor] = None
    image_grid_thw: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = self.response_mask

    @property
    def response_mask(self) -> torch.Tensor:  # [B, S] bool, True on response tokens
        pos = torch.arange(self.tokens.size(1), device=self.tokens.device).unsqueeze(0)
        start = self.prompt_lengths.unsqueeze(1)
        return (pos >= start) & (pos < start + self.response_lengths.unsqueeze(1))

    @property
    def total_lengths(self) -> torch.Tensor:  # [B]
        return self.prompt_lengths + self.response_lengths


@dataclasses.dataclass
class TurnInfo:
    """Per-row bookkeeping of a multi-turn rollout (`rlhf_mcore.rollout.modes.multi_turn`)."""

    spans: list[list[tuple[int, int]]]  # per row: [start, end) token columns of each assistant turn
    tool_calls: list[int]  # per row: tool calls made (parsed or not)
    tool_errors: list[int]  # per row: calls whose result is an error (parse, unknown tool, exception, crash, ...)
    tool_timeouts: list[int]  # per row: calls that timed out

    @property
    def num_turns(self) -> list[int]:
        return [len(s) for s in self.spans]
