r"""MATH (Hendrycks) reward: the last ``\boxed{...}`` answer, normalised, against the ground truth.

Normalisation follows the MATH paper's ``is_equiv`` (fractions, ``\left``/``\right``, degrees, percent, units,
spaces, ``x = ...``) and adds exact numeric equality, so ``0.5``, ``1/2`` and ``\frac{1}{2}`` all match.
"""
from __future__ import annotations

import re

from rlhf_mcore.rewards.dispatch import register_reward
from rlhf_mcore.rewards.numeric import numbers_equal, strip_thousands

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_UNIT_RE = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\{\s*[^{}]*\}(?:\^\{?\d\}?)?$")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_SPACES_RE = re.compile(r"\\[,;:! ]|\s+")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_SQRT_RE = re.compile(r"\\sqrt(\w)")
_FRAC_FIXES = (
    (re.compile(r"\\frac(\d)(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac(\d)\{"), r"\\frac{\1}{"),
    (re.compile(r"\\frac\{([^{}]*)\}(\d)"), r"\\frac{\1}{\2}"),
)
_A_SLASH_B_RE = re.compile(r"(-?\d+)/(-?\d+)")
_LEADING_DOT_RE = re.compile(r"(^|[^\d])\.(\d)")


def extract_boxed_answer(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` or ``\fbox{...}`` (nested braces allowed), else None.

    ``\boxed 5`` (no braces) gives ``5``; an unclosed last box gives None.

    >>> extract_boxed_answer("first \\boxed{1}, then \\boxed{\\frac{a}{b^{2}}}")
    '\\frac{a}{b^{2}}'
    >>> extract_boxed_answer("\\fbox{3} and \\boxed{4") is None
    True
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd):]
    if rest.startswith(" "):
        answer = rest.lstrip(" ").split("$")[0].split("\n")[0].strip()
        return answer or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:i]
    return None


def first_boxed_span(text: str) -> tuple[int, int] | None:
    r"""``(start, end)`` of the first complete ``\boxed{...}`` / ``\fbox{...}`` (braced form), or None.

    >>> first_boxed_span("so \\boxed{1} and \\boxed{2}")
    (3, 12)
    """
    starts = sorted(i for cmd in _BOX_COMMANDS for i in _find_all(text, cmd + "{"))
    for start in starts:
        depth = 0
        for i in range(text.index("{", start), len(text)):
            depth += (text[i] == "{") - (text[i] == "}")
            if depth == 0:
                return start, i + 1
    return None


def _find_all(text: str, sub: str) -> list[int]:
    return [i for i in range(len(text)) if text.startswith(sub, i)]


def normalize_math_answer(answer: str) -> str:
    r"""Canonical string form of a MATH answer (the MATH paper's ``strip_string`` plus a few more rules).

    >>> normalize_math_answer("\\left( \\tfrac12, 3 \\right)")
    '(\\frac{1}{2},3)'
    >>> normalize_math_answer("x = 45^{\\circ}.")
    '45'
    >>> normalize_math_answer("12\\text{ cm}^2")
    '12'
    """
    s = answer.strip().replace("\\\\", "\\").replace("\\!", "")
    s = _LEFT_RIGHT_RE.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for circ in ("^{\\circ}", "^\\circ", "°"):
        s = s.replace(circ, "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    while True:  # a unit after a value: "5 \text{ cm}" -> "5"
        stripped = _UNIT_RE.sub("", s)
        if stripped == s:
            break
        s = stripped
    s = _TEXT_RE.sub(r"\1", s)
    s = _SPACES_RE.sub("", s).rstrip(".")
    s = _LEADING_DOT_RE.sub(r"\g<1>0.\2", s)
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:
        s = parts[1]
    s = _SQRT_RE.sub(r"\\sqrt{\1}", s)
    for pattern, repl in _FRAC_FIXES:
        s = pattern.sub(repl, s)
    s = strip_thousands(s)
    return _A_SLASH_B_RE.sub(r"\\frac{\1}{\2}", s) if _A_SLASH_B_RE.fullmatch(s) else s


def is_math_equiv(pred: str | None, truth: str | None) -> bool:
    r"""Same normalised string, or numbers of the same exact value.

    >>> is_math_equiv("0.5", "\\frac{1}{2}"), is_math_equiv("1/2", "\\frac12"), is_math_equiv("0.3", "1/3")
    (True, True, False)
    """
    if pred is None or truth is None:
        return False
    a, b = normalize_math_answer(pred), normalize_math_answer(truth)
    return a == b or numbers_equal(a, b)


@register_reward("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def compute_math_score(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict:
    r"""``score`` when the last boxed answer equals the ground truth, ``format_score`` for a wrong boxed one.

    A ground truth that itself holds ``\boxed{...}`` is unwrapped first.

    >>> compute_math_score("lighteval/MATH", "Half of it: $\\boxed{\\dfrac{1}{2}}$.", "0.5")
    {'score': 1.0, 'acc': 1.0, 'pred': '\\dfrac{1}{2}'}
    >>> compute_math_score("math", "The set is \\boxed{\\{1, \\{2\\}\\}}", "\\{1,\\{2\\}\\}")["score"]
    1.0
    >>> compute_math_score("math", "no boxed answer: 1/2", "1/2")
    {'score': 0.0, 'acc': 0.0, 'pred': None}
    """
    pred = extract_boxed_answer(solution_str)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    truth = str(ground_truth)
    if any(cmd in truth for cmd in _BOX_COMMANDS):
        truth = extract_boxed_answer(truth) or truth
    correct = is_math_equiv(pred, truth)
    return {"score": float(score if correct else format_score), "acc": float(correct), "pred": pred}
