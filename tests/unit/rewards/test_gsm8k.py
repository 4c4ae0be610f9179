import pytest

from rlhf_mcore.rewards import get_reward_fn
from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score, extract_gsm8k_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("48/2 = 24\n#### 72", "72"),
        ("#### $1,234.", "1234"),
        ("#### -5", "-5"),
        ("#### 3.75", "3.75"),
        ("#### 72 apples in total", "72"),
        ("first #### 1 then\n#### 2", "2"),  # the last marker wins
        ("####72", None),  # strict needs the space
        ("#### ", None),
        ("#### x", None),
        ("The answer is 72.", None),
        ("", None),
    ],
)
def test_strict_extraction(text, expected):
    assert extract_gsm8k_answer(text, "strict") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 72.", "72"),
        ("so 12 + 30 = 42 dollars", "42"),
        ("It costs $1,500 in total", "1500"),
        ("temperature drops to -3.5 degrees", "-3.5"),
        ("step 1... step 2. Finally 7", "7"),
        ("no digits here.", None),
        ("...", None),
    ],
)
def test_flexible_extraction(text, expected):
    assert extract_gsm8k_answer(text, "flexible") == expected


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="strict"):
        extract_gsm8k_answer("#### 1", "loose")


@pytest.mark.parametrize(
    "solution, truth, score",
    [
        ("#### 72", "72", 1.0),
        ("#### 72.00", "72", 1.0),  # same value
        ("#### 1,000", "1000", 1.0),
        ("#### 1000", "1,000", 1.0),  # the ground truth is normalised too
        ("#### $18", "18", 1.0),
        ("#### 18.", 18, 1.0),  # a non-string ground truth
        ("#### 71", "72", 0.0),
        ("#### 7.2", "72", 0.0),
        ("72", "72", 0.0),  # no marker in strict mode
    ],
)
def test_strict_score(solution, truth, score):
    assert compute_gsm8k_score("openai/gsm8k", solution, truth)["score"] == score


def test_format_score_only_for_wellformed_wrong_answers():
    assert compute_gsm8k_score("gsm8k", "#### 71", "72", format_score=0.1) == {
        "score": 0.1, "acc": 0.0, "pred": "71"
    }
    assert compute_gsm8k_score("gsm8k", "I don't know", "72", format_score=0.1)["score"] == 0.0
    assert compute_gsm8k_score("gsm8k", "#### 72", "72", format_score=0.1, score=2.0)["score"] == 2.0


def test_flexible_score():
    out = compute_gsm8k_score("gsm8k", "So she earned $10.", "10", method="flexible")
    assert out == {"score": 1.0, "acc": 1.0, "pred": "10"}


def test_registered_names_share_one_function():
    assert get_reward_fn("openai/gsm8k") is compute_gsm8k_score
    assert get_reward_fn("gsm8k") is compute_gsm8k_score
    with pytest.raises(ValueError, match="Did you mean 'gsm8k'"):
        get_reward_fn("gsm8kk")
