"""What every rollout engine takes and returns."""
from __future__ import annotations

import dataclasses

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

    @property
    def response_mask(self) -> torch.Tensor:  # [B, S] bool, True on response tokens
        pos = torch.arange(self.tokens.size(1), device=self.tokens.device).unsqueeze(0)
        start = self.prompt_lengths.unsqueeze(1)
        return (pos >= start) & (pos < start + self.response_lengths.unsqueeze(1))

    @property
    def total_lengths(self) -> torch.Tensor:  # [B]
        return self.prompt_lengths + self.response_lengths
