r"""verl's geometry3k reward (verl/utils/reward_score/geo3k.py), routed as verl's default_compute_score routes it.

The expected values are verl's: ``0.9 * acc + 0.1 * format``, where format is verl's regex
``<think>.*</think>.*\\boxed\{.*\}.*`` over the whole response and acc is mathruler's
``grade_answer(extract_boxed_content(response), truth)``; each row says which rule decides it. When the table was
written, mathruler 0.1.0 and pylatexenc 2.11 (pure Python, unpacked into a temporary directory for the check only,
never a dependency) gave exactly these (score, acc, format) for every row.
"""
import re

import pytest

from rlhf_mcore.rewards import get_reward_fn, score_batch
from rlhf_mcore.rewards.batch import resolve_reward_fns
from rlhf_mcore.rewards.geometry3k import compute_geo3k_score, has_think_then_box

SOURCE = "hiyouga/geometry3k"
T = "<think>The angles are supplementary.</think> "
VERL_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)  # verl's format_reward pattern

CASES = [  # (response, ground truth, score, acc, format)
    (T + r"So $\boxed{60}$.", "60", 1.0, 1.0, 1.0),
    (r"So $\boxed{60}$.", "60", 0.9, 1.0, 0.0),  # no think block: right but out of format
    (T + r"\boxed{45}", "60", 0.1, 0.0, 1.0),  # wrong, well formed
    (T + "The answer is 60.", "60", 0.0, 0.0, 0.0),  # no box: no answer and no format
    (" " + T + r"\boxed{60}", "60", 0.9, 1.0, 0.0),  # <think> must be the very first character
    (r"<think>no closing tag \boxed{60}", "60", 0.9, 1.0, 0.0),
    (r"\boxed{60} <think>late</think>", "60", 0.9, 1.0, 0.0),  # the think block must come first
    (T + r"\boxed {60}", "60", 0.0, 0.0, 0.0),  # only "\boxed{" opens a box
    (T + r"First \boxed{45}, then \boxed{60}", "60", 1.0, 1.0, 1.0),  # the last box is the answer
    (T + r"First \boxed{60}, then \boxed{45}", "60", 0.1, 0.0, 1.0),
    (T + r"\boxed{60} then \boxed{45", "60", 0.1, 0.0, 1.0),  # the last box never closes: no answer
    (T + r"\boxed{}", "60", 0.1, 0.0, 1.0),  # an empty answer is wrong
    (T + r"\boxed{\frac{10}{\sqrt{2}}}", r"5\sqrt{2}", 1.0, 1.0, 1.0),  # nested braces; sympy: 10/sqrt(2) = 5sqrt(2)
    (T + r"\boxed{60^\circ}", "60", 1.0, 1.0, 1.0),  # MATH normalisation drops ^\circ
    (T + r"\boxed{60^{\circ}}", "60", 1.0, 1.0, 1.0),
    (T + r"\boxed{60°}", "60", 0.1, 0.0, 1.0),  # the degree sign is not dropped by either normalisation
    (T + r"\boxed{60 degrees}", "60", 1.0, 1.0, 1.0),  # PRM800K drops unit words
    (T + r"\boxed{x = 60}", "60", 1.0, 1.0, 1.0),  # a left side of <= 2 characters is dropped
    (T + r"\boxed{m\angle 1 = 60}", "60", 0.1, 0.0, 1.0),  # a longer left side is kept
    (T + r"\boxed{5 \text{ cm}}", "5", 1.0, 1.0, 1.0),  # "\text{ " starts a unit: dropped
    (T + r"\boxed{5\text{cm}^2}", "5", 0.1, 0.0, 1.0),  # "cm" goes, "\text{}^2" stays: 5^2, not an integer
    (T + r"\boxed{ 1,000 }", "1000", 1.0, 1.0, 1.0),  # spaces stripped, thousands commas dropped
    (T + r"\boxed{3.0}", "3", 1.0, 1.0, 1.0),  # a float equal to an integer is that integer
    (T + r"\boxed{\frac{15}{2}}", "7.5", 1.0, 1.0, 1.0),  # sympy: 15/2 - 7.5 = 0
    (T + r"\boxed{15/2}", r"\frac{15}{2}", 1.0, 1.0, 1.0),  # a/b is written \frac{a}{b}
    (T + r"\boxed{30/4}", r"\frac{15}{2}", 0.1, 0.0, 1.0),  # two fractions must match as written
    (T + r"\boxed{\frac{6}{2}}", "3", 0.1, 0.0, 1.0),  # an integer truth takes no non-integer expression
    (T + r"\boxed{7\frac{1}{2}}", "7.5", 1.0, 1.0, 1.0),  # a mixed number: 7 1/2 reads 7+1/2
    (T + r"\boxed{0.5}", r"\frac12", 1.0, 1.0, 1.0),  # MATH normalisation: 0.5 and \frac12 are \frac{1}{2}
    (T + r"\boxed{\dfrac{40}{3}}", "40/3", 1.0, 1.0, 1.0),
    (T + r"\boxed{13.33}", r"\frac{40}{3}", 0.1, 0.0, 1.0),  # no tolerance: sympy's difference is not 0
    (T + r"\boxed{2\sqrt{3}}", r"2\sqrt3", 1.0, 1.0, 1.0),  # \sqrt3 is \sqrt{3}
    (T + r"\boxed{\sqrt{12}}", r"2\sqrt{3}", 1.0, 1.0, 1.0),
    (T + r"\boxed{3.46}", r"2\sqrt{3}", 0.1, 0.0, 1.0),
    (T + r"\boxed{\frac{\sqrt{3}}{2}}", r"\sqrt{3}/2", 1.0, 1.0, 1.0),
    (T + r"\boxed{\frac{1+\sqrt{5}}{2}}", r"(1+\sqrt{5})/2", 0.1, 0.0, 1.0),  # \frac{1+x}{2} reads 1+x/2
    (T + r"\boxed{\sqrt[3]{8}}", r"2\sqrt{2}", 1.0, 1.0, 1.0),  # the root's index is dropped: sqrt(8)
    (T + r"\boxed{12 \pi}", r"12\pi", 1.0, 1.0, 1.0),
    (T + r"\boxed{12\pi}", "37.70", 0.1, 0.0, 1.0),
]


def test_routing():
    assert get_reward_fn(SOURCE) is compute_geo3k_score


@pytest.mark.parametrize("response, truth, score, acc, fmt", CASES)
def test_scores_as_verl(response, truth, score, acc, fmt):
    got = compute_geo3k_score(SOURCE, response, truth)
    assert (got["score"], got["acc"], got["format"]) == (score, acc, fmt)


@pytest.mark.parametrize("text", [
    "", "<think>", "<think></think>", r"<think></think>\boxed{}", r"<think></think>\boxed{",
    r"<think>\boxed{1}</think>", r"<think></think>}\boxed{", r"<think>a</think></think>b\boxed{c}d",
    r"<think><think></think>\boxed}{", "<think>\n</think>\n\\boxed{\n}\n", r"x<think></think>\boxed{}",
    r"<think></think \boxed{1}", r"</think>\boxed{1}", r"<think>a</think>\boxed{\boxed{1}",
    r"<think>a</think>b\boxed{1}c" + "}" * 3,
])
def test_format_check_is_verls_pattern(text):
    assert has_think_then_box(text) == bool(VERL_FORMAT.fullmatch(text))


def test_the_weight_and_the_whole_response_mode():
    right_unformatted = r"so \boxed{60}"
    assert compute_geo3k_score(SOURCE, right_unformatted, "60", format_score=0.5)["score"] == 0.5
    assert compute_geo3k_score(SOURCE, T + r"\boxed{45}", "60", format_score=0.5)["score"] == 0.5
    whole = compute_geo3k_score(SOURCE, "60", "60", use_boxed=False)  # verl's use_boxed=False: the text is the answer
    assert (whole["score"], whole["pred"]) == (0.9, "60")


def test_no_box_is_wrong_even_against_a_none_truth():
    # mathruler turns a missing box into the string "None", so verl scores it right against a truth "None";
    # here a response without a box has no answer (geometry3k's truths are all numbers)
    assert compute_geo3k_score(SOURCE, "no box", "None")["acc"] == 0.0


def test_metrics_reach_the_batch_and_format_score_sets_the_weight():
    r = score_batch([SOURCE] * 3, [T + r"\boxed{60}", r"\boxed{60}", T + r"\boxed{1}"], ["60"] * 3, num_workers=0)
    assert r.scores == [1.0, 0.9, 0.1]
    assert (r.extra["acc"], r.extra["format"], r.extra["pred"]) == ([1.0, 1.0, 0.0], [1.0, 0.0, 1.0], ["60", "60", "1"])
    (fn,) = resolve_reward_fns([SOURCE], None, format_score=0.2)  # reward.format_score, when set, is the weight
    assert fn(SOURCE, r"\boxed{60}", "60", None)["score"] == pytest.approx(0.8)
