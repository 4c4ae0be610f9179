"""The synthetic visual task (`tools/make_shapes_dataset.py`): small images of coloured shapes, questions with a
one-character exact answer ("which colour is the shape?" -> r / g / b, "how many shapes?" -> 1 / 2 / 3).

The score is the fraction of the response's non-space characters that are the answer, so a response that is the
answer alone (repeated or not) scores 1 and a random one about 0: dense enough for GRPO on a random tiny model,
and no image-blind policy beats the most frequent answer's share of the prompts (a third, for balanced colours).
"""
from __future__ import annotations

from rlhf_mcore.rewards.dispatch import register_reward

DATA_SOURCE = "synthetic/shapes"


@register_reward(DATA_SOURCE)
def shapes_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """The fraction of the response's non-space characters that are the answer (`ground_truth`, one character).

    >>> shapes_score("synthetic/shapes", "rr r", "r")
    1.0
    >>> shapes_score("synthetic/shapes", "rg", "r"), shapes_score("synthetic/shapes", "", "2")
    (0.5, 0.0)
    """
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c == str(ground_truth) for c in chars) / len(chars)
