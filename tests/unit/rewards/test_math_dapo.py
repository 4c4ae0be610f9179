"""DAPO's math reward (verl's math_dapo), routed as verl routes it: "math_dapo", "math", "math_dapo_reasoning" and
every "aime*" name. Cases worked by hand from Minerva's normalisation (this implementation also agreed with verl
0.9.1's math_dapo.compute_score on 2,860 generated cases when it was written)."""
import pytest

from rlhf_mcore.rewards import get_reward_fn
from rlhf_mcore.rewards.dispatch import has_reward
from rlhf_mcore.rewards.math_dapo import compute_dapo_score, normalize_answer


@pytest.mark.parametrize("source", ["math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime2025", "aime_x"])
def test_routing(source):
    assert has_reward(source) and get_reward_fn(source) is compute_dapo_score


@pytest.mark.parametrize("raw,normal", [
    ("1,000", "1000"), (r"\$1,000", "1000"), ("x = 7", "7"), (r"\frac12", r"\frac{1}{2}"), (r"\sqrt2", r"\sqrt{2}"),
    (r"\text{5 inches}", "5"), ("10^\\circ", "10"), (r"$\frac{3}{4}$", r"\frac{3}{4}"), (r"\boxed{12}", "12"),
    ("1, 2, 3", "123"), (r"\textbf{B}", "B"), ("an apple", "apple")])  # digits and commas only: an integer
def test_normalization(raw, normal):
    assert normalize_answer(raw) == normal


@pytest.mark.parametrize("solution,truth,score,pred", [
    ("so\nAnswer: 4", "4", 1.0, "4"),
    ("Answer: wrong\nAnswer: 1,000", "1000", 1.0, "1000"),  # the last Answer: counts
    ("answer : 4", "4", 1.0, "4"),  # case and spaces around the colon
    (r"thus \boxed{12}", "12", 1.0, "12"),  # no Answer: the box, as written
    (r"thus \boxed{\frac12}", r"\frac{1}{2}", -1.0, r"\frac12"),  # a box is compared unnormalised
    ("x" * 400 + "Answer: 4", "4", 1.0, "4"),
    ("Answer: 4" + "y" * 400, "4", -1.0, "[INVALID]"),  # only the last 300 characters count
    (r"\boxed{12} " + "z" * 120, "12", -1.0, "[INVALID]"),  # the box only in the last 100
    ("I guess 4", "4", -1.0, "[INVALID]")])
def test_scores(solution, truth, score, pred):
    got = compute_dapo_score("math_dapo", solution, truth)
    assert (got["score"], got["acc"], got["pred"]) == (score, score > 0, pred)
