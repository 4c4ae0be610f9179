"""verl's multimodal parquet (data/images.py, data/vision_prompt.py): rows with `<image>` placeholders and an images
column in every form verl / HF datasets write (bytes, {"bytes"}, {"path"}, a path) give transformers' token ids
(the chat template of content parts, each <|image_pad|> expanded to its grid's token count, as
Qwen2_5_VLProcessor does), its image processor's pixels and grids; broken images are one error naming the file and
row, before any model (the start-up checks open every image)."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlhf_mcore.data.dataset import load_prompt_dataset
from rlhf_mcore.data.io import write_prompt_parquet
from rlhf_mcore.data.schema import check_row
from rlhf_mcore.data.vision_prompt import VisionProcessor
from rlhf_mcore.models.vision_step import row_images, stack_row_images
from tools.make_shapes_dataset import draw, png
from tools.make_tiny_vlm import IDS, write_tiny_vlm


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture(scope="module")
def tok(vlm_dir):
    from rlhf_mcore.tokenizer import load_tokenizer

    return load_tokenizer(vlm_dir)


@pytest.fixture(scope="module")
def processor(vlm_dir):
    from rlhf_mcore.models.hf_io import read_hf_config

    return VisionProcessor.from_hf_dir(vlm_dir, read_hf_config(vlm_dir))


def image(colour="r", size=None):
    img = draw([("square", colour, 0)])
    return img.resize(size) if size else img


def row(content, images):
    return {"data_source": "synthetic/shapes", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": "r"}, "images": images}


def transformers_reference(tok, processor, content, pil_images):
    """Qwen2_5_VLProcessor's steps: content parts through the chat template, each <|image_pad|> expanded to
    grid.prod() // merge**2 copies, the pixels of the image processor."""
    parts = []
    for k, piece in enumerate(content.split("<image>")):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    text = tok.hf.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                      add_generation_prompt=True)
    out = processor.image_processor(images=pil_images, return_tensors="pt")
    for grid in out["image_grid_thw"]:
        text = text.replace("<|image_pad|>", "<|placeholder|>" * int(grid.prod() // 4), 1)
    ids = tok.hf(text.replace("<|placeholder|>", "<|image_pad|>"), add_special_tokens=False)["input_ids"]
    return ids, out["pixel_values"], out["image_grid_thw"]


def test_rows_in_every_image_form_give_transformers_ids_pixels_and_grids(tmp_path, tok, processor):
    wide = image("g", (84, 40))  # resized by the processor to 4 x 6 patches (a 56 x 84 image: its aspect kept)
    (tmp_path / "img").mkdir()
    wide.save(tmp_path / "img" / "wide.png")
    files = [[row("<image>Which colour?", [png(image("r"))])],  # a parquet column holds one form: a file each
             [row("Left <image> right <image>.", [{"bytes": png(image("b")), "path": None},
                                                  {"bytes": None, "path": "img/wide.png"}])],
             [row("<image>?", ["img/wide.png"]), row("plain text", None)]]  # a relative path: next to the file
    paths = [tmp_path / f"train{k}.parquet" for k in range(3)]
    for records, path in zip(files, paths):
        write_prompt_parquet(records, path)
    ds = load_prompt_dataset(paths, tok, 200, processor=processor)
    assert len(ds) == 4
    pil = [[image("r")], [image("b"), wide], [wide], []]
    contents = ["<image>Which colour?", "Left <image> right <image>.", "<image>?", "plain text"]
    for got, content, imgs in zip(ds.rows, contents, pil):
        want_ids, want_pixels, want_grids = transformers_reference(tok, processor, content, imgs) if imgs else \
            (tok.encode(tok.apply_chat_template([{"role": "user", "content": content}])), None, None)
        assert list(got.prompt_ids) == want_ids
        if imgs:
            tokens = sum(t * h * w // 4 for t, h, w in got.image_grid_thw)  # merged 2 x 2
            assert got.prompt_ids.count(IDS["<|image_pad|>"]) == tokens and tokens >= 4 * len(imgs)
            assert [list(g) for g in got.image_grid_thw] == want_grids.tolist()
            pixels, grids = processor.pixels([im for im in imgs])
            assert torch.equal(pixels, want_pixels.float()) and torch.equal(grids, want_grids)
    assert isinstance(ds.rows[2].images[0], str) and ds.rows[2].images[0].endswith("img/wide.png")


def test_broken_images_name_file_and_row(tmp_path, tok, processor):
    cases = {"bytes": ([b"not an image"], "row 1: images[0]: cannot decode the image (12 bytes"),
             "missing": (["nowhere/x.png"], "row 1: images[0]: file not found: nowhere/x.png"),
             "count": ([png(image()), png(image())], "row 1: prompt: has 1 <image> placeholder(s) for 2 image(s)")}
    image().save(tmp_path / "ok.png")
    for name, (images, message) in cases.items():
        path = tmp_path / f"{name}.parquet"
        good = [str(tmp_path / "ok.png")] if name == "missing" else [png(image())]  # one form per parquet column
        records = [row("<image>ok", good), row("<image>bad", images)]
        pq.write_table(pa.Table.from_pylist(records), path)
        with pytest.raises(ValueError) as err:
            load_prompt_dataset(path, tok, 200, processor=processor)
        assert f"{path}: {message}" in str(err.value), (name, str(err.value))
    with pytest.raises(ValueError, match="x: row 1: images.0.: must be image bytes, a path or a dict"):
        check_row(row("<image>", [3]), "x: row 1")


def test_images_for_a_text_model_are_refused(tmp_path, tok):
    path = tmp_path / "t.parquet"
    write_prompt_parquet([row("<image>x", [png(image())])], path)
    with pytest.raises(ValueError, match="row 0: images: the row has 1 image.s. but the model is text-only"):
        load_prompt_dataset(path, tok, 200)
    with pytest.raises(ValueError, match="videos are not supported"):
        check_row(row("<video><image>", [png(image())]), "r")


def test_preflight_opens_every_image_before_any_model(tmp_path, vlm_dir):
    from rlhf_mcore.config import load_config
    from rlhf_mcore.trainer.preflight import static_errors

    path = tmp_path / "train.parquet"
    records = [row("<image>ok", [png(image())]) for _ in range(20)] + [row("<image>bad", [b"\x89PNG broken"])]
    write_prompt_parquet(records, path)
    cfg = load_config(None, [f"model.hf_path={vlm_dir}", f"data.train_files={path}", "data.train_batch_size=2",
                             "data.max_prompt_length=64", f"trainer.output_dir={tmp_path / 'run'}"], check=False)
    errs, _ = static_errors(cfg)
    assert any(f"data.train_files: {path}: row 20: images[0]: cannot decode the image" in e for e in errs), errs


def test_row_fields_round_trip():
    a = (torch.randn(8, 5), torch.tensor([[1, 2, 2], [1, 2, 2]]))
    b = (torch.randn(4, 5), torch.tensor([[1, 2, 2]]))
    fields = stack_row_images([a, None, b], 5, "cpu")
    assert fields["pixel_values"].shape == (3, 8, 5) and fields["image_grid_thw"].shape == (3, 2, 3)
    pixels, grids = row_images(fields["pixel_values"], fields["image_grid_thw"])
    assert torch.equal(pixels, torch.cat([a[0], b[0]])) and torch.equal(grids, torch.cat([a[1], b[1]]))
