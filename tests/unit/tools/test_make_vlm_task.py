"""tools/make_shapes_dataset.py and tools/make_tiny_vlm.py: every image shows what its answer says (the colour of its
pixels, the number of coloured cells), the answers are balanced, the reward scores the answer alone 1, and data/shapes
and data/tiny_vlm are what the tools write for the tiny VLM preset."""
import io

import numpy as np
import pytest
from PIL import Image

from rlhf_mcore.data import read_parquet_rows
from rlhf_mcore.rewards import get_reward_fn
from tests.support.paths import ROOT
from tools.make_shapes_dataset import COLOURS, main, rows


def pixels(row) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")).astype(int)


def colour_of(img: np.ndarray) -> str:
    """The letter whose RGB the image's non-white pixels are."""
    coloured = img[(img != 255).any(-1)]
    return min(COLOURS, key=lambda c: np.abs(coloured - np.array(COLOURS[c])).sum(-1).mean())


def coloured_cells(img: np.ndarray) -> int:
    return sum(bool((img[y:y + 28, x:x + 28] != 255).any()) for y in (0, 28) for x in (0, 28))


def test_images_show_their_answers():
    data = rows(30, seed=5, split="train")
    for row in data:
        img, answer, task = pixels(row), row["reward_model"]["ground_truth"], row["extra_info"]["task"]
        if task == "colour":
            assert colour_of(img) == answer and coloured_cells(img) == 4  # one large shape over the image
        else:
            assert coloured_cells(img) == int(answer)
    answers = [r["reward_model"]["ground_truth"] for r in data if r["extra_info"]["task"] == "colour"]
    assert sorted(answers) == sorted("rgb" * 5)
    score = get_reward_fn("synthetic/shapes")
    assert score("synthetic/shapes", "r", "r", None) == 1.0 and score("synthetic/shapes", "g", "r", None) == 0.0


def test_shipped_data_is_the_tools_output(tmp_path):
    main(["--out", str(tmp_path), "--tasks", "colour"])
    for split in ("train", "test"):
        ours, shipped = (read_parquet_rows(d / f"{split}.parquet") for d in (tmp_path, ROOT / "data" / "shapes"))
        assert ours == shipped


@pytest.mark.parametrize("family, shipped_dir", [("qwen2_5_vl", "tiny_vlm"), ("qwen3_vl", "tiny_vlm3")])
def test_shipped_tiny_vlm_is_the_tools_output(tmp_path, family, shipped_dir):
    import json

    from tools.make_tiny_vlm import write_tiny_vlm

    write_tiny_vlm(tmp_path, family=family)
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json", "tokenizer_config.json"):
        ours, shipped = (json.loads((d / name).read_text()) for d in (tmp_path, ROOT / "data" / shipped_dir))
        ours.pop("transformers_version", None), shipped.pop("transformers_version", None)
        assert ours == shipped, name
