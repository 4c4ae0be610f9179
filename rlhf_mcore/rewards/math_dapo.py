r"""DAPO's math reward (verl's ``math_dapo``): data sources ``math_dapo``, ``math``, ``math_dapo_reasoning`` and every
name starting with ``aime`` (``aime2024``, ``aime2025``, ...), as verl's ``default_compute_score`` routes them.

Only the last ``TAIL_CHARS`` characters of the response count. The answer is the text after the last
``Answer:`` (Minerva's format, case-insensitive, to the end of its line), normalised as Minerva's quantitative
reasoning answers are (`normalize_answer`) and compared with the normalised ground truth. A response with no
``Answer:`` falls back to its last ``\boxed{...}`` within the last ``BOX_TAIL_CHARS`` characters, compared with the
ground truth as written. Score 1.0 when right, -1.0 otherwise (never 0); ``acc`` and ``pred`` as the other rewards.

>>> compute_dapo_score("math_dapo", "so 2 + 2 = 4.\nAnswer: 4", "4")
{'score': 1.0, 'acc': True, 'pred': '4'}
>>> compute_dapo_score("aime2024", r"the area is \boxed{\frac{1}{2}}", r"\frac{1}{2}")["score"]
1.0
>>> compute_dapo_score("aime2025", "I think 5", "4")
{'score': -1.0, 'acc': False, 'pred': '[INVALID]'}
"""
from __future__ import annotations

import re

from rlhf_mcore.rewards.dispatch import register_reward, register_reward_prefix

TAIL_CHARS = 300  # the longest answer in MATH-500 has 159 characters
BOX_TAIL_CHARS = 100
INVALID = "[INVALID]"
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva's normalisation, in order: plain replacements, then words and TeX that carry no value, then regexes
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
         "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
         "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
         "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots")
_REWRITE = ((r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),  # the first $...$ span only
            (r"(\\text\{)(.*?)(\})", "\\2"), (r"(\\textbf\{)(.*?)(\})", "\\2"), (r"(\\overline\{)(.*?)(\})", "\\2"),
            (r"(\\boxed\{)(.*)(\})", "\\2"),
            (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
            (r"(sqrt)([^{])", "sqrt{\\2}"))  # \sqrta -> \sqrt{a}


def normalize_answer(answer: str) -> str:
    r"""Minerva's normal form of a final answer: the part after the last "=", units and TeX decoration dropped,
    shorthand fractions and roots braced, "$" removed, thousands separators dropped from a plain integer.

    >>> normalize_answer(r"x = \$1,000"), normalize_answer(r"\text{5 inches}"), normalize_answer(r"\frac12")
    ('1000', '5', '\\frac{1}{2}')
    """
    answer = answer.split("=")[-1]
    for old, new in _REPLACE:
        answer = answer.replace(old, new)
    for word in _DROP:
        answer = answer.replace(word, "")
    for pattern, repl in _REWRITE:
        answer = re.sub(pattern, repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` whose braces close, else None.

    >>> last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}"), last_boxed(r"\boxed{open")
    ('\\frac{a}{b}', None)
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if text[i] == "}" and depth == 0:
            return text[start + len("\\boxed{"):i]
    return None


def judge(response: str, truth: str) -> tuple[bool, str]:
    """(right, the prediction): the last ``Answer:``, normalised; without one, the last box of the tail."""
    found = _ANSWER_RE.findall(response)
    pred = normalize_answer(found[-1] if found else INVALID)
    if pred != INVALID:
        return pred == normalize_answer(truth), pred
    boxed = last_boxed(response[-BOX_TAIL_CHARS:])
    if boxed is not None:
        return boxed == truth, boxed
    return False, pred


@register_reward("math_dapo", "math", "math_dapo_reasoning")
@register_reward_prefix("aime")
def compute_dapo_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    """1.0 / -1.0 by `judge` on the last TAIL_CHARS characters.

    >>> compute_dapo_score("math", "Answer: $1,000$ dollars", "1000")["score"]
    1.0
    """
    right, pred = judge(solution_str[-TAIL_CHARS:], str(ground_truth))
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
