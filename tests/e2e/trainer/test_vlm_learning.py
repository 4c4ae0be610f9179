"""GRPO learns a visual task on a tiny vision-language model: configs/tiny_vlm_grpo.yaml (a random Qwen2.5-VL, its
tower frozen, the colour task of tools/make_shapes_dataset.py) raises the greedy reward on the held-out split from 0
to at least 0.6 within 40 steps with a fixed seed, past the 1/3 that no policy blind to the image can beat
(balanced colours): the language model reads the image embeddings that the rollout prefills and the trainer
scatters (measured on CPU: 0 -> 0.67 at step 20 -> 1.0 at step 40, about 20 s). Its last checkpoint holds the frozen
tower (vision.safetensors) and its HF export loads in transformers with every tensor in place; `rlhf_mcore.generate`
on it with the held-out images gives what `rlhf_mcore.evaluate` decodes; a one-step run with the tower trained exports
the trained tower."""
import json
import os

import pytest

from tests.launch import cli
from tests.support.paths import ROOT_STR as ROOT

KEY = "val-core/synthetic/shapes/reward/mean@1"


def test_tiny_vlm_grpo_learns_the_colour_of_the_shape_and_exports_its_tower(tmp_path):
    proc = cli("rlhf_mcore.train", "--config", os.path.join(ROOT, "configs", "tiny_vlm_grpo.yaml"),
               f"trainer.output_dir={tmp_path}", "trainer.save_freq=-1", "trainer.resume=disable",
               "trainer.export_hf=true", "trainer.logger=jsonl", extra_env={"OMP_NUM_THREADS": "1"})
    out = proc.stderr + proc.stdout
    assert "actor: vision tower random (model.init=random)" in out and "frozen (model.freeze_vision_tower=true)" in out
    assert "prompts with their images" in out
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    val = {r["step"]: r[KEY] for r in records if KEY in r}
    rewards = [r["critic/score/mean"] for r in records if "critic/score/mean" in r]
    print(f"tiny VLM GRPO: held-out reward {val}; train reward {rewards[0]:.3f} -> {rewards[-1]:.3f}")
    assert sorted(val) == [0, 20, 40] and len(rewards) == 40
    assert val[0] < 0.2 and val[40] >= 0.6, val
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3, rewards
    check_the_export(tmp_path, 40)  # the frozen tower: the export takes vision.safetensors
    generate_with_images(tmp_path, "tiny_vlm_grpo.yaml", 40)


def generate_with_images(run_dir, config: str, step: int) -> None:
    """`python -m rlhf_mcore.generate` on the run's last checkpoint with the held-out parquet's prompts and images,
    and a --prompt with an --image file (row 0's image): greedy, the responses `rlhf_mcore.evaluate` dumps for the
    same checkpoint (the trainer's validation path), and row 0's again for the command-line prompt."""
    import pyarrow.parquet as pq

    from rlhf_mcore.config.load import load_config

    config = os.path.join(ROOT, "configs", config)
    checkpoint, val = run_dir / f"global_step_{step}", load_config(config, []).data.val_files
    cli("rlhf_mcore.evaluate", "--config", config, "--checkpoint", checkpoint, "--out", run_dir / "eval",
        "model.init=auto")
    want = [json.loads(line)["output"] for line in (run_dir / "eval" / "generations" / "0.jsonl").read_text()
            .splitlines()]
    row0 = pq.read_table(os.path.join(ROOT, val)).to_pylist()[0]
    (run_dir / "row0.png").write_bytes(row0["images"][0]["bytes"])
    cli("rlhf_mcore.generate", "--config", config, "--checkpoint", checkpoint, "--prompts", os.path.join(ROOT, val),
        "--prompt", row0["prompt"][0]["content"], "--image", run_dir / "row0.png", "--out", run_dir / "gen.jsonl",
        "model.init=auto")
    got = [json.loads(line)["response"] for line in (run_dir / "gen.jsonl").read_text().splitlines()]
    print(f"generate with images: {got[:4]} ..., evaluate: {want[:3]} ...")
    assert got[1:] == want and got[0] == got[1] and len(want) > 10


@pytest.mark.parametrize("preset", ["tiny_vlm3_grpo", "tiny_vlm3_moe_grpo"])
def test_tiny_qwen3_vl_grpo_learns_the_colour_and_exports(tmp_path, preset):
    """configs/tiny_vlm3_grpo.yaml (a random Qwen3-VL: interleaved M-RoPE, DeepStack into LM layers 0 and 1) and
    configs/tiny_vlm3_moe_grpo.yaml (a random Qwen3-VL-MoE: 3 MoE layers of 4 experts, DeepStack into all three) learn
    the same task past the 1/3 a blind policy gets (measured on CPU: dense 0 -> 0.5 at step 20 -> 0.67 at step 40,
    MoE 0 -> 0.33 -> 1.0 in 27 s), and their HF exports (model.language_model.*, model.visual.*; the MoE's experts
    fused in the Hub's layout) load in transformers with every tensor in place."""
    cli("rlhf_mcore.train", "--config", os.path.join(ROOT, "configs", f"{preset}.yaml"),
        f"trainer.output_dir={tmp_path}", "trainer.save_freq=-1", "trainer.resume=disable", "trainer.export_hf=true",
        "trainer.logger=jsonl", extra_env={"OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    val = {r["step"]: r[KEY] for r in records if KEY in r}
    print(f"{preset}: held-out reward {val}")
    assert sorted(val) == [0, 20, 40] and val[0] < 0.2 and val[40] >= 0.6, val
    check_the_export(tmp_path, 40)
    if "moe" in preset:  # the Hub's layout, read back by safetensors alone: [E, H, 2I] and [E, I, H]
        from safetensors import safe_open

        with safe_open(str(tmp_path / "hf_export" / "global_step_40" / "model.safetensors"), "pt") as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys() if ".mlp.experts." in k}
        assert len(shapes) == 6 and all(s == ([4, 64, 96] if k.endswith("gate_up_proj") else [4, 48, 64])
                                        for k, s in shapes.items()), shapes


ONE_STEP = ("trainer.total_steps=1", "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.resume=disable",
            "trainer.export_hf=true", "trainer.logger=jsonl")


def check_the_export(run_dir, step: int):
    """transformers loads the run's HF export at `step` with every tensor in place, its tower equals the
    checkpoint's vision.safetensors (returned), and the image processor's config goes with it."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    saved = load_file(str(run_dir / f"global_step_{step}" / "actor" / "vision.safetensors"))
    export = run_dir / "hf_export" / f"global_step_{step}"
    model, info = AutoModelForImageTextToText.from_pretrained(str(export), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    exported = {k.replace("model.visual.", "visual."): v for k, v in model.state_dict().items() if "visual." in k}
    assert sorted(exported) == sorted(saved) and all(torch.equal(exported[k], saved[k]) for k in saved)
    assert (export / "preprocessor_config.json").is_file()
    return saved


def run_one_step_and_check_the_export(tmp_path, *overrides: str):
    """One step of the tiny VLM preset with its HF export (`check_the_export`): the checkpoint's tower and the
    run's output."""
    proc = cli("rlhf_mcore.train", "--config", os.path.join(ROOT, "configs", "tiny_vlm_grpo.yaml"),
               f"trainer.output_dir={tmp_path}", *ONE_STEP, *overrides, extra_env={"OMP_NUM_THREADS": "1"})
    return check_the_export(tmp_path, 1), proc.stderr + proc.stdout


def test_hf_export_writes_the_trained_tower(tmp_path):
    """model.freeze_vision_tower=false: one step changes the tower, and the HF export writes the trained tower (from
    the actor's dist-checkpoint), equal to what the trainer's tower held at the save (vision.safetensors) and not the
    random start (the run's seeded init, rebuilt here); transformers loads the export with every tensor in place."""
    import torch

    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.models.vision import build_run_tower

    saved, out = run_one_step_and_check_the_export(tmp_path, "model.freeze_vision_tower=false")
    assert "trained" in out
    cfg = load_config(os.path.join(ROOT, "configs", "tiny_vlm_grpo.yaml"),
                      [*ONE_STEP, "model.freeze_vision_tower=false"], check=False)
    cfg.model.hf_path = os.path.join(ROOT, cfg.model.hf_path)
    start, _ = build_run_tower(load_hf_config(cfg.model), cfg.model, "cpu", torch.float32, cfg.trainer.seed)
    start = {f"visual.{k}": v.to(saved[f"visual.{k}"].dtype) for k, v in start.state_dict().items()}
    changed = [k for k in saved if not torch.equal(start[k], saved[k])]
    step = max((saved[k].float() - start[k].float()).abs().max().item() for k in saved)
    assert len(changed) > len(saved) // 2, changed  # the update reached the tower
    assert step <= 1.05 * cfg.actor.optim.lr, step  # one Adam step from the seeded start: at most lr per weight
