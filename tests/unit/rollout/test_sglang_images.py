"""A vision LM through the embedded SGLang engine (rollout/sglang_images.py), around a stand-in server: each row's
images go with it in SGLang's preprocessed form and its ids stay ours; the engine's start directory is the actor,
tower included, as transformers reads it (same logits with images); every refresh sends the tower, frozen or not."""
import itertools
import json
import shutil

import pytest
import torch

from rlhf_mcore.models.full_weights import FullWeights, hf_weights
from rlhf_mcore.rollout import sglang_images
from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine, write_hf_dir
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny_vl import END, IMAGE, START, image_batch, save_tiny_family, vl_actor
from tests.unit.rollout.test_sglang_engine import StandIn, setup_for


class ImageStandIn(StandIn):
    """The stand-in server, recording each generate call's image_data."""

    def __init__(self):
        super().__init__()
        self.image_data = []

    def generate(self, input_ids, sampling_params, return_logprob, image_data=None):
        self.image_data.append(image_data)
        return super().generate(input_ids, sampling_params, return_logprob)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    from transformers import Qwen2VLImageProcessor

    path = save_tiny_family("qwen2_5_vl", tmp_path_factory.mktemp("vl") / "hf")
    Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(str(path))
    return path


def prompt_images(seed: int = 0):
    b = image_batch(seed)
    patches = int(b["image_grid_thw"][0].prod())
    return b["pixel_values"][:patches], b["image_grid_thw"][:1]


def test_rows_carry_their_prompts_images_and_keep_their_ids(vl_dir, mcore_ctx):
    cfg, state = vl_actor(vl_dir, mcore_ctx)
    actor = state.model[0]
    engine = SGLangRolloutEngine(setup_for(actor, cfg_hf(vl_dir), mcore_ctx, hf_dir=str(vl_dir)), 1 << 20,
                                 ImageStandIn())
    pv, thw = prompt_images()
    with_image = [5, START, IMAGE, IMAGE, IMAGE, IMAGE, END, 7]  # 4 image tokens: a 1x4x4 grid merged 2x2
    batch = engine.generate([with_image, [5, 6]], SamplingParams(n=2, max_new_tokens=2), images=[(pv, thw), None])
    assert engine.engine.prompts == [[with_image, with_image, [5, 6], [5, 6]]]  # our ids, unchanged
    assert engine.engine.prefills == []  # with images the prefix is shared by the image hash instead
    data = engine.engine.image_data[0]
    assert data[2] is None and data[3] is None and data[0] is data[1]
    item = data[0][0]
    assert item["format"] == "processor_output" and item["pixel_values"].device.type == "cpu"
    assert torch.equal(item["pixel_values"], pv) and torch.equal(item["image_grid_thw"], thw)
    assert item["hash"] == sglang_images.images_hash(pv, thw)
    assert batch.tokens.tolist()[0][-2:] == [8, 9]  # the stand-in answers prompt[-1] + 1, + 2
    # the trainer's passes get each row's images with the batch, as from the native engine
    assert torch.equal(batch.pixel_values[1, :pv.size(0)], pv) and not batch.pixel_values[2].any()
    assert batch.image_grid_thw[:, 0].tolist() == [thw[0].tolist()] * 2 + [[0, 0, 0]] * 2
    text = engine.generate([[5, 6], [7]], SamplingParams(n=2, max_new_tokens=2))  # text only: as before
    assert getattr(text, "pixel_values", None) is None
    assert engine.engine.image_data[-1] is None and engine.engine.prefills == [[[5, 6], [7]]]


def test_continued_rows_keep_their_images_and_an_image_id_after_the_prompt_is_refused(vl_dir, mcore_ctx):
    """Multi-turn and partial rollouts continue a sample with its prompt's images and length; SGLang would read an
    image id after the prompt as an image, so such a row is one error. A vision LM's partial rollouts run in rounds
    (`continuous` is off): the continuous path would send rows without their images."""
    _, state = vl_actor(vl_dir, mcore_ctx)
    engine = SGLangRolloutEngine(setup_for(state.model[0], cfg_hf(vl_dir), mcore_ctx), 1 << 20, ImageStandIn())
    assert not engine.continuous
    pv, thw = prompt_images()
    prompt = [5, START, IMAGE, IMAGE, IMAGE, IMAGE, END, 7]
    batch = engine.generate([prompt + [8, 9]], SamplingParams(n=1, max_new_tokens=2), images=[(pv, thw)],
                            prompt_lengths=[len(prompt)])
    assert engine.engine.prompts[-1] == [prompt + [8, 9]] and engine.engine.image_data[-1][0] is not None
    assert torch.equal(batch.pixel_values[0, :pv.size(0)], pv)
    with pytest.raises(ValueError, match="sample 0 has an image or video token id at position 9, after its prompt"):
        engine.generate([prompt + [8, IMAGE]], SamplingParams(n=1, max_new_tokens=2), images=[(pv, thw)],
                        prompt_lengths=[len(prompt)])


def cfg_hf(vl_dir):
    from rlhf_mcore.models.hf_io import read_hf_config

    return read_hf_config(vl_dir)


def test_start_directory_is_the_actor_with_its_tower_as_transformers_reads_it(vl_dir, mcore_ctx, tmp_path):
    from transformers import AutoModelForImageTextToText

    _, state = vl_actor(vl_dir, mcore_ctx)
    actor, hf = state.model[0], cfg_hf(vl_dir)
    named = itertools.chain(hf_weights(FullWeights(actor, mcore_ctx), hf), sglang_images.tower_tensors(actor))
    path = write_hf_dir(named, {**hf, "architectures": None}, torch.float32)  # as data/tiny_vlm's had (H200: SGLang
    # indexes architectures[0] and raised a TypeError)
    assert json.load(open(f"{path}/config.json"))["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    copied = sglang_images.copy_processor_files(str(vl_dir), path)
    assert "preprocessor_config.json" in copied
    b = image_batch()
    theirs = AutoModelForImageTextToText.from_pretrained(str(vl_dir)).eval()
    started = AutoModelForImageTextToText.from_pretrained(path).eval()
    with torch.no_grad():
        want = theirs(**b).logits
        got = started(**b).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    bare = tmp_path / "bare"
    shutil.copytree(vl_dir, bare)
    (bare / "preprocessor_config.json").unlink()
    with pytest.raises(ValueError, match="preprocessor_config.json"):
        sglang_images.copy_processor_files(str(bare), str(tmp_path))


def test_a_qwen3_vl_start_directory_loads_in_transformers_with_sglangs_rope_fields(mcore_ctx, tmp_path):
    """Qwen3-VL: the start directory has transformers' nested names (its class loads no other), the DeepStack
    mergers, the same logits with images, and the text config's `rope_scaling` / `rope_theta` with
    `mrope_interleaved` that SGLang's own config class reads (transformers 5 writes only `rope_parameters`)."""
    import json

    from transformers import AutoModelForImageTextToText

    from tests.support.tiny_vl import PATCH_DIM3, save_tiny_family

    vl3 = save_tiny_family("qwen3_vl", tmp_path / "hf")
    _, state = vl_actor(vl3, mcore_ctx)
    actor, hf = state.model[0], cfg_hf(vl3)
    named = itertools.chain(hf_weights(FullWeights(actor, mcore_ctx), hf), sglang_images.tower_tensors(actor))
    path = write_hf_dir(named, hf, torch.float32)
    text = json.load(open(f"{path}/config.json"))["text_config"]
    params = hf["text_config"]["rope_parameters"]
    assert text["rope_scaling"] == {"rope_type": "default", "mrope_section": params["mrope_section"],
                                    "mrope_interleaved": True} and text["rope_theta"] == params["rope_theta"]
    started, info = AutoModelForImageTextToText.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert any("deepstack_merger_list" in k for k in started.state_dict())
    b = image_batch(0, PATCH_DIM3)
    with torch.no_grad():
        want = AutoModelForImageTextToText.from_pretrained(str(vl3)).eval()(**b).logits
        got = started.eval()(**b).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("freeze", [True, False])
def test_the_tower_is_sent_with_every_refresh_and_a_trained_ones_cache_is_off(vl_dir, mcore_ctx, freeze):
    """A frozen tower too: the engine's release drops every weight it holds (H200, Qwen3-VL: the frozen tower left
    out of the refresh ran on garbage; mismatch 1.40 from the first token)."""
    _, state = vl_actor(vl_dir, mcore_ctx, freeze=freeze)
    actor = state.model[0]
    engine = SGLangRolloutEngine(setup_for(actor, cfg_hf(vl_dir), mcore_ctx), 1 << 20, ImageStandIn())
    engine.update_weights(actor)
    sent = dict(pair for named, _ in engine.engine.calls for pair in named)
    tower = {k: v for k, v in sent.items() if k.startswith("visual.")}
    assert any(k.startswith("model.layers.") for k in sent) and "model.embed_tokens.weight" in sent
    want = dict(sglang_images.tower_tensors(actor))
    assert set(tower) == set(want) and all(torch.equal(tower[k], want[k]) for k in want)
    assert "visual.blocks.0.attn.qkv.weight" in tower and "visual.merger.mlp.0.weight" in tower
    assert sglang_images.vlm_cache_env(actor) == ({} if freeze else {"SGLANG_VLM_CACHE_SIZE_MB": "0"})
