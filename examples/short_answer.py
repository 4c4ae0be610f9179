r"""The reward of the demo's arithmetic task (`tools/make_arith_dataset.py`): a `reward.custom_fn` example.

    reward.custom_fn=examples/short_answer.py:compute_score

- ``acc``: the last number in the response is the answer.
- ``format``: the response is one short line (at most ``MAX_WORDS`` words, no line break): it answered and stopped,
  instead of rambling on after the answer.
- ``score``: acc + ``FORMAT_SCORE`` x format.

>>> compute_score("arith/add", "13 + 14 = 27", "27")
{'score': 1.5, 'acc': 1.0, 'format': 1.0}
>>> compute_score("arith/add", "13 + 14 = 27\n\nThis is a classic example of", "27")["score"]
1.0
>>> compute_score("arith/add", "The answer is 26.", "27")
{'score': 0.5, 'acc': 0.0, 'format': 1.0}
"""
from __future__ import annotations

import re

MAX_WORDS = 6
FORMAT_SCORE = 0.5
_NUMBER_RE = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    text = solution_str.strip()
    numbers = _NUMBER_RE.findall(text)
    acc = float(bool(numbers) and numbers[-1] == str(ground_truth).strip())
    fmt = float(bool(text) and "\n" not in text and len(text.split()) <= MAX_WORDS)
    return {"score": acc + FORMAT_SCORE * fmt, "acc": acc, "format": fmt}
