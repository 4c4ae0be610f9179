import pytest

from rlhf_mcore.rewards.penalties import (
    apply_penalties,
    format_penalties,
    format_penalty,
    overlong_penalties,
    overlong_penalty,
)


def test_overlong_is_linear_in_the_buffer():
    # max 1000, buffer 200: free up to 800 tokens, then -1/200 per token down to -1 at 1000.
    lengths = [0, 800, 801, 900, 950, 1000, 1200]
    expected = [0.0, 0.0, -0.005, -0.5, -0.75, -1.0, -1.0]
    assert overlong_penalties(lengths, max_length=1000, buffer=200) == pytest.approx(expected)
    assert overlong_penalty(900, max_length=1000, buffer=200, factor=0.4) == pytest.approx(-0.2)


@pytest.mark.parametrize("buffer", [0, -5, 1001])
def test_overlong_rejects_bad_buffer(buffer):
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(10, max_length=1000, buffer=buffer)


def test_format_penalties():
    assert format_penalty("#### 12", "gsm8k") == 0.0
    assert format_penalty("the answer is 12", "gsm8k", penalty=0.5) == -0.5
    assert format_penalties([r"\boxed{1}", r"\boxed{1", "1"], "boxed", penalty=1.0) == [0.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="unknown answer format 'boxd'. Did you mean 'boxed'"):
        format_penalty("x", "boxd")


def test_apply_penalties():
    assert apply_penalties([1.0, 1.0, 0.0], [0.0, -0.5, 0.0], [-0.25, 0.0, -1.0]) == [0.75, 0.5, -1.0]
    assert apply_penalties([1.0]) == [1.0]
    with pytest.raises(ValueError, match="penalty list 0 has 1 entries but there are 2 scores"):
        apply_penalties([1.0, 0.0], [0.0])
