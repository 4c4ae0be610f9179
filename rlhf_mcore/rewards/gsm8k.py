r"""GSM8K reward: the number after ``#### `` (strict) or the last number in the text (flexible).

Answers are normalised before comparison: thousands commas, ``$`` and a trailing ``.`` are dropped, and
numbers compare by exact value (``72.00`` equals ``72``).
"""
from __future__ import annotations

import re

from rlhf_mcore.rewards.dispatch import register_reward
from rlhf_mcore.rewards.numeric import numbers_equal

_NUMBER = r"-?\$?-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)\.?"
_STRICT_RE = re.compile(r"#### \$?(" + _NUMBER + ")")
_FLEXIBLE_RE = re.compile("(" + _NUMBER + ")")
METHODS = ("strict", "flexible")


def normalize_gsm8k_number(s: str) -> str:
    """``"$1,000."`` -> ``"1000"``: drop ``$``, commas, surrounding spaces and trailing dots.

    >>> normalize_gsm8k_number(" -$1,234.5. ")
    '-1234.5'
    """
    return s.strip().replace("$", "").replace(",", "").rstrip(".")


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    r"""The normalised final answer, or None when there is none.

    strict: the number after the last ``#### ``. flexible: the last number anywhere in the text.

    >>> extract_gsm8k_answer("2 + 3 = 5\n#### 5")
    '5'
    >>> extract_gsm8k_answer("so 1,200 apples, then 3.", method="flexible")
    '3'
    """
    if method == "strict":
        found = _STRICT_RE.findall(solution_str)
    elif method == "flexible":
        found = _FLEXIBLE_RE.findall(solution_str)
    else:
        raise ValueError(f"gsm8k method must be one of {METHODS} (got {method!r})")
    return normalize_gsm8k_number(found[-1]) if found else None


def first_strict_answer_span(solution_str: str) -> tuple[int, int] | None:
    r"""``(start, end)`` of the first ``#### <number>`` in the text, or None.

    >>> first_strict_answer_span("x\n#### 5\n#### 6")
    (2, 8)
    """
    found = _STRICT_RE.search(solution_str)
    return found.span() if found else None


@register_reward("openai/gsm8k", "gsm8k")
def compute_gsm8k_score(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict:
    r"""``score`` for a correct answer, ``format_score`` for a well-formed wrong one, 0 when none is found.

    >>> compute_gsm8k_score("openai/gsm8k", "48/2 = 24, so 48 + 24 = 72.\n#### 72", "72")
    {'score': 1.0, 'acc': 1.0, 'pred': '72'}
    >>> compute_gsm8k_score("gsm8k", "She earns $1,000.", "1000")  # strict needs '#### '
    {'score': 0.0, 'acc': 0.0, 'pred': None}
    >>> compute_gsm8k_score("gsm8k", "She earns $1,000.", "1000", method="flexible")
    {'score': 1.0, 'acc': 1.0, 'pred': '1000'}
    >>> compute_gsm8k_score("gsm8k", "#### 71", "72", format_score=0.1)
    {'score': 0.1, 'acc': 0.0, 'pred': '71'}

    A multi-turn sample (``extra_info["assistant_turns"]``: the text of each assistant turn, tool output never
    in it) is scored on its last assistant turn only, its final answer:

    >>> compute_gsm8k_score("gsm8k", "#### 72\nI will check.", "72", {"assistant_turns": ["#### 72", "I will check."]})
    {'score': 0.0, 'acc': 0.0, 'pred': None}
    """
    turns = (extra_info or {}).get("assistant_turns")
    if turns is not None:
        solution_str = turns[-1] if turns else ""
    pred = extract_gsm8k_answer(solution_str, method)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    truth = normalize_gsm8k_number(str(ground_truth))
    correct = pred == truth or numbers_equal(pred, truth)
    return {"score": float(score if correct else format_score), "acc": float(correct), "pred": pred}
