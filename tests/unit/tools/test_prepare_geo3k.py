"""tools/prepare_geo3k.py writes verl's Geometry3K rows (examples/data_preprocess/geo3k.py, and with --tools
geo3k_multiturn_w_tool.py) from the Hub's parquet layout, and our loader takes them with a vision LM: each `<image>`
expanded to its image's tokens. A row without its figure is one error naming the file and row."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_mcore.data.dataset import load_prompt_dataset
from tools.make_shapes_dataset import draw, png
from tools.make_tiny_vlm import write_tiny_vlm
from tools.prepare_geo3k import INSTRUCTION, TOOL_SYSTEM, main

PROBLEM = "<image>Find x. Round to the nearest tenth if necessary."


def hub_dataset(root, rows: int = 2, images=True):
    """The Hub's layout of hiyouga/geometry3k: data/{train,test}-00000-of-00001.parquet (images, problem, answer)."""
    figure = {"bytes": png(draw([("square", "r", 0)])), "path": None}
    for split in ("train", "test"):
        records = [{"images": [figure] if images else [], "problem": PROBLEM, "answer": str(3 + i)}
                   for i in range(rows)]
        (root / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(records), root / "data" / f"{split}-00000-of-00001.parquet")
    return figure


def test_rows_are_verls_and_load_with_their_images(tmp_path):
    figure = hub_dataset(tmp_path / "geometry3k")
    assert main(["--input-dir", str(tmp_path / "geometry3k"), "--output-dir", str(tmp_path / "out")]) == 0
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert rows[1] == {"data_source": "hiyouga/geometry3k",  # verl's process_fn, field by field
                       "prompt": [{"role": "user", "content": f"{PROBLEM} {INSTRUCTION}"}], "images": [figure],
                       "ability": "math", "reward_model": {"style": "rule", "ground_truth": "4"},
                       "extra_info": {"split": "train", "index": 1, "answer": "4", "question": PROBLEM}}
    assert INSTRUCTION.endswith("The final answer MUST BE put in \\boxed{}.")
    from rlhf_mcore.data.vision_prompt import VisionProcessor
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.tokenizer import load_tokenizer

    vlm = write_tiny_vlm(tmp_path / "tiny_vlm")
    processor = VisionProcessor.from_hf_dir(vlm, read_hf_config(vlm))
    ds = load_prompt_dataset(str(tmp_path / "out" / "test.parquet"), load_tokenizer(vlm), 400, processor=processor)
    first = ds[0]
    assert len(ds) == 2 and len(first.image_grid_thw) == 1 and first.images == (figure["bytes"],)
    assert first.prompt_ids.count(processor.tokens.image) == processor.token_count(first.image_grid_thw[0]) > 0


def test_tools_rows_are_verls_multi_turn_rows(tmp_path):
    hub_dataset(tmp_path / "geometry3k", rows=1)
    main(["--input-dir", str(tmp_path / "geometry3k"), "--output-dir", str(tmp_path / "out"), "--tools"])
    [row] = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert row["prompt"] == [{"role": "system", "content": TOOL_SYSTEM},
                             {"role": "user", "content": f"{PROBLEM} {INSTRUCTION}"}]
    extra = row["extra_info"]
    assert extra["need_tools_kwargs"] and extra["tools_kwargs"] == {
        "calc_geo3k_reward": {"create_kwargs": {"ground_truth": "3"}}}


def test_a_row_without_its_figure_names_file_and_row(tmp_path):
    hub_dataset(tmp_path / "geometry3k", images=False)
    with pytest.raises(ValueError, match=r"data/train-00000-of-00001.parquet: row 0: 'images' is empty"):
        main(["--input-dir", str(tmp_path / "geometry3k"), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="no train.parquet or data/train-"):
        main(["--input-dir", str(tmp_path / "nothing"), "--output-dir", str(tmp_path / "out")])
