r"""Optional reward shaping as pure functions: DAPO's soft overlong punishment, a missing-format penalty and a
post-answer penalty (text after the first answer line: the repeated ``#### N`` lines a policy learns to spam).

Each returns a value <= 0 to add to the task reward (``apply_penalties`` does the sum for a batch).

>>> [overlong_penalty(n, max_length=100, buffer=20) for n in (50, 80, 90, 100)]
[0.0, 0.0, -0.5, -1.0]
>>> format_penalty("the answer is 4", "boxed", penalty=0.5), format_penalty("\\boxed{4}", "boxed")
(-0.5, 0.0)
>>> post_answer_penalty("so 4\n#### 4\n#### 4", "gsm8k", 0.5), post_answer_penalty("so 4\n#### 4\n", "gsm8k", 0.5)
(-0.5, 0.0)
"""
from __future__ import annotations

from typing import Callable, Sequence

from rlhf_mcore.registry import Registry
from rlhf_mcore.rewards.gsm8k import extract_gsm8k_answer, first_strict_answer_span
from rlhf_mcore.rewards.hendrycks_math import extract_boxed_answer, first_boxed_span

FORMAT_CHECKS: Registry[Callable[[str], bool]] = Registry("answer format")
ANSWER_SPANS: Registry[Callable[[str], "tuple[int, int] | None"]] = Registry("answer format")
ANSWER_SPANS.register("gsm8k")(first_strict_answer_span)
ANSWER_SPANS.register("boxed")(first_boxed_span)


@FORMAT_CHECKS.register("gsm8k")
def has_gsm8k_answer(text: str) -> bool:
    """True when the text ends its reasoning with ``#### <number>``."""
    return extract_gsm8k_answer(text, "strict") is not None


@FORMAT_CHECKS.register("boxed")
def has_boxed_answer(text: str) -> bool:
    r"""True when the text holds a complete ``\boxed{...}`` (or ``\fbox{...}``) answer."""
    return extract_boxed_answer(text) is not None


def overlong_penalty(length: int, *, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO soft overlong punishment: 0 up to ``max_length - buffer`` tokens, then linear down to ``-factor``.

    Lengths beyond ``max_length`` (not produced when generation is capped) stay at ``-factor``.
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong buffer must be in (0, max_length={max_length}] (got {buffer})")
    exceed = length - (max_length - buffer)
    return max(-factor, min(0.0, -exceed / buffer * factor))


def overlong_penalties(
    lengths: Sequence[int], *, max_length: int, buffer: int, factor: float = 1.0
) -> list[float]:
    """``overlong_penalty`` for every response length of a batch."""
    return [overlong_penalty(n, max_length=max_length, buffer=buffer, factor=factor) for n in lengths]


def format_penalty(solution_str: str, fmt: str = "boxed", penalty: float = 1.0) -> float:
    """``-penalty`` when the solution lacks the answer format ``fmt`` (a name in FORMAT_CHECKS), else 0."""
    return 0.0 if FORMAT_CHECKS.get(fmt)(solution_str) else -float(penalty)


def format_penalties(solutions: Sequence[str], fmt: str = "boxed", penalty: float = 1.0) -> list[float]:
    """``format_penalty`` for every solution of a batch."""
    check = FORMAT_CHECKS.get(fmt)
    return [0.0 if check(s) else -float(penalty) for s in solutions]


def post_answer_penalty(solution_str: str, fmt: str = "gsm8k", penalty: float = 1.0) -> float:
    """``-penalty`` when non-blank text follows the line of the FIRST answer (format ``fmt``), else 0.

    A response without an answer is left to ``format_penalty`` (0 here).
    """
    span = ANSWER_SPANS.get(fmt)(solution_str)
    if span is None:
        return 0.0
    line_end = solution_str.find("\n", span[1])
    return -float(penalty) if line_end >= 0 and solution_str[line_end:].strip() else 0.0


def post_answer_penalties(solutions: Sequence[str], fmt: str = "gsm8k", penalty: float = 1.0) -> list[float]:
    """``post_answer_penalty`` for every solution of a batch."""
    return [post_answer_penalty(s, fmt, penalty) for s in solutions]


def apply_penalties(scores: Sequence[float], *penalties: Sequence[float]) -> list[float]:
    """Element-wise ``scores + sum(penalties)``; every list must have the batch length.

    >>> apply_penalties([1.0, 0.0], [0.0, -0.5], [-0.25, 0.0])
    [0.75, -0.5]
    """
    for k, p in enumerate(penalties):
        if len(p) != len(scores):
            raise ValueError(f"penalty list {k} has {len(p)} entries but there are {len(scores)} scores")
    return [s + sum(p[i] for p in penalties) for i, s in enumerate(scores)]
