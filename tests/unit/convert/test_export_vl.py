"""Vision LM checkpoints (Qwen2.5-VL, Qwen3-VL) carry the vision tower (convert/vision_weights.py): `hf-to-mcore` stores
it beside the dist-checkpoint (vision.safetensors), `mcore-to-hf` and a training checkpoint's HF export write the whole
model back (the LM and tower under the names transformers loads: Qwen3-VL's nested `model.language_model.*` and
`model.visual.*`; the nested config.json), and transformers reloads it with no missing or unexpected keys and the same
logits with images (fp32, within 1e-5)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.support.tiny_hf import diff_state_dicts, load_tensors
from tests.support.tiny_vl import FAMILIES, family_in, image_batch, save_tiny_family
from tools.convert_checkpoint import run


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def vl_dir(tmp_path_factory, request):
    return save_tiny_family(request.param, tmp_path_factory.mktemp(f"export_{request.param}") / "hf")


def family_batch(vl_dir) -> dict:
    return image_batch(0, FAMILIES[family_in(vl_dir)][1])


def tower_prefix(names) -> str:
    """Where the checkpoint keeps its tower: `visual.` (Qwen2.5-VL as transformers 5 saves it) or `model.visual.`."""
    return "model.visual." if any(n.startswith("model.visual.") for n in names) else "visual."


def reload(out: Path):
    """transformers' model of an export, after checking that every tensor found its place."""
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32,
                                                              output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def hf_logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def max_error(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return (a - b).abs()[mask.bool()].max().item()


def test_hf_to_mcore_to_hf_keeps_the_vision_tower(vl_dir, mcore_ctx, tmp_path):
    mcore, out = tmp_path / "mcore", tmp_path / "export"
    assert run(["hf-to-mcore", "--hf-dir", str(vl_dir), "--out", str(mcore)]) == 0
    source = load_tensors(vl_dir)
    tower, prefix = load_file(str(mcore / "vision.safetensors")), tower_prefix(source)
    assert tower and all(k.startswith("visual.") and torch.equal(v, source[prefix + k[len("visual."):]])
                         for k, v in tower.items())  # stored under the table's canonical names
    assert run(["mcore-to-hf", "--mcore-dir", str(mcore), "--out", str(out)]) == 0
    assert diff_state_dicts(source, load_tensors(out)) == []  # transformers' own names, bit for bit
    config = json.loads((out / "config.json").read_text())
    assert config["text_config"] == json.loads((vl_dir / "config.json").read_text())["text_config"]
    with pytest.raises(ValueError, match="verify compares text-only forwards"):
        run(["verify", "--hf-dir", str(vl_dir), "--mcore-dir", str(mcore)])
    batch = family_batch(vl_dir)
    err = max_error(hf_logits(reload(vl_dir), batch), hf_logits(reload(out), batch), batch["attention_mask"])
    print(f"{vl_dir.parent.name} hf -> mcore -> hf logits max |diff| = {err:.2e}")
    assert err <= 1e-5


def test_training_export_writes_the_whole_vision_model(vl_dir, mcore_ctx, tmp_path):
    """An actor (LM changed as by training, tower frozen) exports as a model transformers reloads with our logits."""
    from rlhf_mcore.checkpoint import save_checkpoint
    from rlhf_mcore.config.schema import Config, ModelConfig
    from rlhf_mcore.convert.export import export_actor_to_hf
    from rlhf_mcore.models.vision import build_vision_lm
    from rlhf_mcore.trainer.optim import build_train_state
    from tests.support.checkpoint import perturb
    from tests.support.tiny_vl import our_logits

    cfg = Config(model=ModelConfig(hf_path=str(vl_dir), dtype="fp32", attention_backend="sdpa"))
    vlm = build_vision_lm(str(vl_dir), "actor", cfg.model, cfg.parallel, mcore_ctx)
    perturb(vlm.lm, 5)
    batch = family_batch(vl_dir)
    ours = our_logits(vlm, batch, mcore_ctx.pgs.tp)
    state = build_train_state(vlm.lm, cfg.actor.optim, cfg.parallel)
    path = save_checkpoint(tmp_path / "run", 1, {"actor": state}, {}, mcore_ctx)
    out = Path(export_actor_to_hf(SimpleNamespace(cfg=cfg, run_dir=str(tmp_path / "run")), path))
    exported, source = load_tensors(out), load_tensors(vl_dir)
    assert exported.keys() == source.keys()
    assert all(torch.equal(exported[k], v) for k, v in source.items() if k.startswith(tower_prefix(source)))
    norm = next(k for k in source if k.endswith("model.norm.weight") or k.endswith("language_model.norm.weight"))
    assert not torch.equal(exported[norm], source[norm])  # the trained LM
    err = max_error(hf_logits(reload(out), batch), ours, batch["attention_mask"])
    print(f"{vl_dir.parent.name} training export: transformers logits max |diff| from ours = {err:.2e}")
    assert err <= 1e-5


def test_an_export_without_the_tower_anywhere_is_one_line(vl_dir, tmp_path):
    from rlhf_mcore.config.schema import ModelConfig
    from rlhf_mcore.convert.export import tower_dirs
    from rlhf_mcore.convert.vision_weights import vision_for_export

    hf = json.loads((vl_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="no vision tower tensors") as err:  # neither the checkpoint nor model.load
        vision_for_export(hf, tower_dirs(str(tmp_path), ModelConfig(load=str(tmp_path))), torch.float32, "ckpt")
    assert "\n" not in str(err.value)
    assert vision_for_export({"model_type": "qwen2"}, [str(vl_dir)], torch.float32, "ckpt") == {}  # text model
