"""`python -m rlhf_mcore.generate`'s prompts (rlhf_mcore/generate.py `read_prompts`): each --prompt takes the next
--image files for its `<image>` placeholders, in order; a count that does not match is one error naming the prompt
or the files left over."""
import pytest

from rlhf_mcore.generate import read_prompts


def test_each_prompt_takes_its_images_in_order():
    rows = read_prompts(["<image>a?", "b?", "<image> and <image>: c?"], ["x.png", "y.png", "z.png"], "")
    assert [where for where, _ in rows] == ["--prompt 0", "--prompt 1", "--prompt 2"]
    assert [row.images for _, row in rows] == [("x.png",), (), ("y.png", "z.png")]
    assert rows[2][1].messages == ({"role": "user", "content": "<image> and <image>: c?"},)


def test_a_placeholder_without_its_image_and_an_image_without_a_placeholder_are_refused():
    with pytest.raises(ValueError, match=r"^--prompt 1: 2 <image> placeholder\(s\) but 1 --image file\(s\) left"):
        read_prompts(["<image>a", "<image><image>b"], ["x.png", "y.png"], "")
    with pytest.raises(ValueError, match=r"^--image: 1 file\(s\) without an <image> placeholder"):
        read_prompts(["a"], ["x.png"], "")
