import pytest

from rlhf_mcore.rewards import get_reward_fn
from rlhf_mcore.rewards.hendrycks_math import (
    compute_math_score,
    extract_boxed_answer,
    is_math_equiv,
    normalize_math_answer,
)
from rlhf_mcore.rewards.numeric import parse_number


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{5}$.", "5"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{\{1,\{2\}\}}", r"\{1,\{2\}\}"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{1} and \fbox{2}", "2"),
        (r"so \boxed 7$ done", "7"),
        (r"\boxed{}", ""),
        (r"\boxed{3", None),  # unclosed
        (r"\boxed{1} then \boxed{2", None),  # the last box is broken
        (r"\boxed", None),
        ("the answer is 5", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed_answer(text) == expected


@pytest.mark.parametrize(
    "raw, normalised",
    [
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        (r"\frac1{2}", r"\frac{1}{2}"),
        ("3/4", r"\frac{3}{4}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        (r"50\%", "50"),
        (r"\$5", "5"),
        (r"10\text{ cm}", "10"),
        (r"12 \mbox{ inches}^2", "12"),
        (r"\text{(B)}", "(B)"),
        ("x = 3", "3"),
        ("7.", "7"),
        (".5", "0.5"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("1,000", "1000"),
        ("(1,2)", "(1,2)"),
        (r"a \, b", "ab"),
    ],
)
def test_normalize(raw, normalised):
    assert normalize_math_answer(raw) == normalised


@pytest.mark.parametrize(
    "pred, truth, equal",
    [
        ("0.5", r"\frac{1}{2}", True),
        ("1/2", r"\frac{1}{2}", True),
        ("0.5", "1/2", True),
        (r"-\frac{3}{4}", "-0.75", True),
        (r"\frac{-3}{4}", "-0.75", True),
        ("2.50", r"\frac52", True),
        (r"\dfrac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}", True),
        ("10", r"10\text{ cm}", True),
        ("0.33", r"\frac{1}{3}", False),
        ("2", "3", False),
        ("(1,2)", "(2,1)", False),
        ("1/0", "1/0", True),  # not a number, but the same string
        ("1/0", "0", False),
        (None, "1", False),
    ],
)
def test_equivalence(pred, truth, equal):
    assert is_math_equiv(pred, truth) is equal


def test_parse_number_rejects_non_numbers():
    assert parse_number("1e999999999") is None  # a huge exponent would take forever as a Fraction
    assert parse_number("2e3") == 2000
    assert parse_number("x") is None
    assert parse_number("1,2") is None
    assert parse_number("9" * 100) is None


def test_score_and_registry():
    assert compute_math_score("math", r"so \boxed{\frac{2}{4}}", "0.5")["score"] == 1.0  # 2/4 == 1/2 exactly
    assert compute_math_score("math", r"\boxed{3}", r"the answer is $\boxed{3}$")["score"] == 1.0
    assert compute_math_score("math", r"\boxed{4}", "3", format_score=0.1) == {"score": 0.1, "acc": 0.0, "pred": "4"}
    assert compute_math_score("math", "4", "4", format_score=0.1)["score"] == 0.0
    for name in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert get_reward_fn(name) is compute_math_score
