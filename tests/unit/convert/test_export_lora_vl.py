"""LoRA on a vision LM (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE; rank 4 on every linear of the language model, the MoE's
experts too, which peft adapts as fused target_parameters): the start-up budget reads the LM's fields under
config.json's `text_config` (it raised "'num_hidden_layers' is missing" before), and the HF export of its checkpoint
writes merged weights that transformers loads and a PEFT adapter named after transformers' module tree
(`model.language_model.layers.*`), which peft loads onto the base vision LM; both give the trainer's logits with
images (fp32, within 1e-5), and the adapters move them."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.tiny_vl import FAMILIES, family_in, image_batch, save_tiny_family

pytest.importorskip("peft")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def vl_dir(tmp_path_factory, request):
    return save_tiny_family(request.param, tmp_path_factory.mktemp(f"lora_{request.param}") / "hf")


def test_a_lora_vision_lm_exports_merged_weights_and_a_peft_adapter(vl_dir, mcore_ctx, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from rlhf_mcore.checkpoint import save_checkpoint
    from rlhf_mcore.config import load_config
    from rlhf_mcore.convert.export import export_actor_to_hf
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.hf_load import load_hf_weights
    from rlhf_mcore.models.lora import LoraSettings, adapter_parameters
    from rlhf_mcore.models.lora_budget import lora_budget
    from rlhf_mcore.models.lora_export import ADAPTER_DIR
    from rlhf_mcore.models.vision import VisionLM, vision_side
    from rlhf_mcore.trainer.optim import build_train_state
    from rlhf_mcore.trainer.roles import attach_run_tower
    from tests.support.tiny_vl import our_logits

    cfg = load_config(None, [f"model.hf_path={vl_dir}", "model.attention_backend=sdpa", "model.dtype=fp32",
                             "model.lora_rank=4", "model.lora_alpha=8", "trainer.export_hf=false"], check=False)
    hf = read_hf_config(vl_dir)
    budget = lora_budget(hf, LoraSettings.from_model_cfg(cfg.model), "fp32")
    assert 0 < budget.trainable < budget.total
    model = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    load_hf_weights(model, str(vl_dir), hf, 0, 1)
    attach_run_tower(model, cfg, hf, mcore_ctx)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # as after some updates: B != 0
        for _, p in adapter_parameters(model):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    batch = image_batch(0, FAMILIES[family_in(vl_dir)][1])
    ours = our_logits(VisionLM.from_parts(model, vision_side(model).tower, hf), batch, mcore_ctx.pgs.tp)
    path = save_checkpoint(tmp_path / "run", 1, {"actor": build_train_state(model, cfg.actor.optim, cfg.parallel)},
                           {}, mcore_ctx)
    out = Path(export_actor_to_hf(SimpleNamespace(cfg=cfg, run_dir=str(tmp_path / "run")), path))
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        merged = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32).eval()(**batch).logits
        base = AutoModelForImageTextToText.from_pretrained(str(vl_dir), dtype=torch.float32).eval()
        plain = base(**batch).logits  # before peft injects the adapters into `base` in place
        peft = PeftModel.from_pretrained(base, str(out / ADAPTER_DIR)).eval()(**batch).logits
    errors = {k: (v - ours).abs()[valid].max().item() for k, v in (("merged", merged), ("peft", peft),
                                                                     ("adapters' effect", plain))}
    print(vl_dir.parent.name, errors)
    assert errors["merged"] < 1e-5 and errors["peft"] < 1e-5 and errors["adapters' effect"] > 0.05, errors
