"""The record one RL step passes from phase to phase: this DP rank's samples, typed.

Per-token fields are [B, S] and aligned with `tokens` (x[:, t] belongs to token t; S = max prompt + max
response length, the same on every rank). Each phase returns a new `StepBatch` with its fields filled in
(`replace`), so the trainer never names a field by string. Micro-batches (the loss functions' input) stay
plain dicts: `StepBatch` is also a read-only mapping of its set fields, which is what `schedule` cuts.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from torch import Tensor


@dataclass(kw_only=True, slots=True, eq=False)
class StepBatch(Mapping):
    # from the rollout and the scorer
    tokens: Tensor  # [B, S] long, prompt then response, right-padded
    lengths: Tensor  # [B] prompt + response tokens
    response_mask: Tensor  # [B, S] float, 1 on response tokens
    rollout_logp: Tensor  # [B, S] the engine's log-probs at response tokens, 0 elsewhere
    token_level_scores: Tensor  # [B, S] the sequence score at its last token (+ reward model score)
    group_index: Tensor  # [B] long, global prompt id shared by the n samples of a prompt
    response_lengths: Tensor  # [B]
    prompt_lengths: Tensor  # [B]
    baseline_rewards: Tensor | None = None  # [B] reward of the prompt's greedy rollout (estimators that need it)
    pixel_values: Tensor | None = None  # [B, P_max, D] a vision LM's rows' image patches (zero-padded; per row)
    image_grid_thw: Tensor | None = None  # [B, I_max, 3] their (t, h, w) grids, zero rows after a row's images
    # forward-only passes
    old_logp: Tensor | None = None  # [B, S] actor before the update (None on on-policy steps)
    sum_pi_squared: Tensor | None = None  # [B, S] sum_v pi_old(v)^2 (estimators that need it)
    ref_logp: Tensor | None = None  # [B, S] reference policy
    values: Tensor | None = None  # [B, S] critic V(s_t)
    routed_experts: Tensor | None = None  # [B, S, L, k] the old policy's top-k experts (actor.router_replay=R2)
    # advantage phase
    is_weights: Tensor | None = None  # [B, S] rollout importance weights (actor.rollout_correction)
    token_level_rewards: Tensor | None = None  # [B, S] scores with the KL penalty when it is in the reward
    advantages: Tensor | None = None  # [B, S]
    returns: Tensor | None = None  # [B, S]

    @property
    def num_rows(self) -> int:
        return self.tokens.size(0)

    def replace(self, **fields) -> StepBatch:
        return dataclasses.replace(self, **fields)

    def __getitem__(self, name: str) -> Tensor:
        value = getattr(self, name, None) if name in _FIELDS else None
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in _FIELDS if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


_FIELDS = tuple(f.name for f in dataclasses.fields(StepBatch))
