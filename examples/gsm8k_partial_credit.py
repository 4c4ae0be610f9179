r"""A GSM8K reward with partial credit for the intermediate results: a `reward.custom_fn` example, for short runs
(a few CPU steps, small budgets) that should already carry a learning signal on GSM8K.

    reward.custom_fn=examples/gsm8k_partial_credit.py:compute_score

The score is the built-in strict GSM8K reward with verl's ``format_score`` (1 for a right ``#### N``, 0.1 for
a wrong one, 0 without one) plus up to ``PARTIAL`` for the intermediate results of the reference solution
(the values after ``=`` in its ``<<48/2=24>>`` annotations, from ``extra_info["answer"]``) that the response
states as numbers. A 135M model rarely reaches ``#### N`` within a few dozen tokens, but it often computes
one of the steps, and samples differ in which: the group advantages are rarely all zero.

>>> ref = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"
>>> compute_score("openai/gsm8k", "48 / 2 = 24 in May", "72", {"answer": ref})
{'score': 0.15, 'acc': 0.0, 'pred': None, 'partial': 0.15}
>>> compute_score("openai/gsm8k", "24, then 72.\n#### 72", "72", {"answer": ref})["score"]
1.3
"""
from __future__ import annotations

import re

from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score, normalize_gsm8k_number
from rlhf_mcore.rewards.numeric import numbers_equal

PARTIAL = 0.3  # credit when every intermediate result appears
FORMAT_SCORE = 0.1
_CALC_RE = re.compile(r"<<[^=<>]*=([^<>]+)>>")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def intermediate_results(reference: str) -> list[str]:
    """The values computed in a GSM8K reference solution's ``<<expr=value>>`` annotations, in order.

    >>> intermediate_results("<<48/2=24>>24 and <<48+24=72>>72")
    ['24', '72']
    """
    return [normalize_gsm8k_number(v) for v in _CALC_RE.findall(reference)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    result = compute_gsm8k_score(data_source, solution_str, ground_truth, format_score=FORMAT_SCORE)
    steps = intermediate_results((extra_info or {}).get("answer", ""))
    stated = [normalize_gsm8k_number(n) for n in _NUMBER_RE.findall(solution_str)]
    hits = sum(any(numbers_equal(step, n) for n in stated) for step in steps)
    partial = round(PARTIAL * hits / len(steps), 4) if steps else 0.0
    return {**result, "score": round(result["score"] + partial, 4), "partial": partial}
