"""Collate prompt rows for the rollout engine (token ids as lists; the engine pads) and for the rewards.

>>> from rlhf_mcore.data.schema import PromptRow
>>> row = PromptRow(7, "openai/gsm8k", ({"role": "user", "content": "1+1?"},), "math", "2", {"split": "train"},
...                 prompt_ids=(5, 6, 7))
>>> batch = collate_prompts([row])
>>> batch.prompt_ids, batch.data_sources, batch.ground_truths, batch.indices
([[5, 6, 7]], ['openai/gsm8k'], ['2'], [7])
>>> repeat_prompts(batch, 2).prompt_ids
[[5, 6, 7], [5, 6, 7]]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rlhf_mcore.data.schema import PromptRow


@dataclass(frozen=True, slots=True)
class PromptBatch:
    prompt_ids: list[list[int]]  # [B][prompt_len_i], unpadded
    data_sources: list[str]  # [B]
    ground_truths: list[Any]  # [B]
    extra_infos: list[dict]  # [B]
    indices: list[int]  # [B] row index in the source file

    def __len__(self) -> int:
        return len(self.prompt_ids)


def collate_prompts(rows: Sequence[PromptRow]) -> PromptBatch:
    """Column lists of a list of rows; raises when a row was never tokenised."""
    for row in rows:
        if not row.prompt_ids:
            raise ValueError(f"row {row.index} has no prompt_ids; load it through load_prompt_dataset")
    return PromptBatch(
        prompt_ids=[list(r.prompt_ids) for r in rows],
        data_sources=[r.data_source for r in rows],
        ground_truths=[r.ground_truth for r in rows],
        extra_infos=[r.extra_info for r in rows],
        indices=[r.index for r in rows],
    )


def repeat_prompts(batch: PromptBatch, n: int) -> PromptBatch:
    """Each prompt ``n`` times in a row (GRPO groups): ``[p0, p0, p1, p1, ...]`` for ``n = 2``."""
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    rep = lambda column: [x for x in column for _ in range(n)]
    return PromptBatch(
        rep(batch.prompt_ids), rep(batch.data_sources), rep(batch.ground_truths), rep(batch.extra_infos),
        rep(batch.indices),
    )
