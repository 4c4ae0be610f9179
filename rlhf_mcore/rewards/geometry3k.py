r"""Geometry3K reward (verl's ``geo3k``): data source ``hiyouga/geometry3k``, as verl's ``default_compute_score``
routes it.

Two checks, weighted: ``score = (1 - format_score) * acc + format_score * format``, ``format_score`` 0.1 as in
verl. So a right, well-formed answer scores 1.0, a right one out of format 0.9, a wrong well-formed one 0.1.
- format: the response is ``<think>...</think>`` from its very first character, then a ``\boxed{...}`` later on
  (verl's ``<think>.*</think>.*\\boxed\{.*\}.*`` matched against the whole response);
- acc: the content of the last ``\boxed{...}`` (nested braces allowed; an unclosed last box is no answer) equals
  the ground truth by PRM800K's grader (``sympy_grader.grade_answer``, mathruler's in verl).
``acc``, ``format`` and ``pred`` (the boxed answer) come back with the score as per-sample metrics.
"""
from __future__ import annotations

from rlhf_mcore.rewards.dispatch import register_reward
from rlhf_mcore.rewards.math_dapo import last_boxed
from rlhf_mcore.rewards.sympy_grader import grade_answer

FORMAT_WEIGHT = 0.1  # verl's geo3k.compute_score default


def has_think_then_box(text: str) -> bool:
    r"""True when ``text`` starts with ``<think>``, closes it, and has ``\boxed{`` and a ``}`` after that.

    The same strings as verl's pattern, found by three scans instead of a backtracking regex.

    >>> has_think_then_box("<think>2+2</think> so \\boxed{4}"), has_think_then_box(" <think>x</think>\\boxed{4}")
    (True, False)
    """
    if not text.startswith("<think>"):
        return False
    close = text.find("</think>", len("<think>"))
    box = -1 if close < 0 else text.find("\\boxed{", close + len("</think>"))
    return box >= 0 and text.find("}", box + len("\\boxed{")) >= 0


def boxed_answer(text: str) -> str | None:
    r"""The stripped content of the last ``\boxed{...}``, or None when there is none or it never closes.

    >>> boxed_answer("\\boxed{1} then \\boxed{ \\frac{a}{b^{2}} }"), boxed_answer("\\boxed{1} then \\boxed{2")
    ('\\frac{a}{b^{2}}', None)
    """
    found = last_boxed(text)
    return None if found is None else found.strip()


@register_reward("hiyouga/geometry3k")
def compute_geo3k_score(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info: dict | None = None,
    *,
    use_boxed: bool = True,
    format_score: float = FORMAT_WEIGHT,
) -> dict:
    r"""``(1 - format_score) * acc + format_score * format``; use_boxed=False grades the whole response.

    >>> compute_geo3k_score("hiyouga/geometry3k", "<think>x = 6/2</think> \\boxed{3}", "3")
    {'score': 1.0, 'acc': 1.0, 'format': 1.0, 'pred': '3'}
    >>> compute_geo3k_score("hiyouga/geometry3k", "so \\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}")["score"]
    0.9
    >>> compute_geo3k_score("hiyouga/geometry3k", "<think>?</think> \\boxed{45}", "60")["score"]
    0.1
    """
    pred = boxed_answer(solution_str) if use_boxed else solution_str
    acc = float(grade_answer(pred, str(ground_truth)))
    fmt = float(has_think_then_box(solution_str))
    return {"score": (1.0 - format_score) * acc + format_score * fmt, "acc": acc, "format": fmt, "pred": pred}
