"""Reward of the tiny synthetic task: the fraction of the response's characters that are vowels.

>>> vowel_fraction("tiny/vowels", "banana", "aeiou", None)
0.5
>>> vowel_fraction("tiny/vowels", "", "aeiou", None)
0.0
"""


def vowel_fraction(data_source, solution_str, ground_truth, extra_info):
    if not solution_str:
        return 0.0
    return sum(c in ground_truth for c in solution_str) / len(solution_str)
