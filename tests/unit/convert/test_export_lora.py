"""HF export of a LoRA run's checkpoint (convert/export.py): the checkpoint holds adapters only, the export
rebuilds the base from model.hf_path and writes merged safetensors (transformers loads them) plus
`lora_adapter/` (peft loads it onto the base); both give the trainer's logits (fp32). A run started from
that adapter (model.lora_adapter_path, through the trainer's roles) gives them too."""
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.checkpoint import save_checkpoint
from rlhf_mcore.config import Config, ModelConfig
from rlhf_mcore.convert.export import export_actor_to_hf
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.lora import adapter_parameters
from rlhf_mcore.models.lora_export import ADAPTER_DIR
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.trainer.optim import build_train_state
from tests.support.tiny_hf import save_tiny

pytest.importorskip("peft")
TOKENS = torch.randint(0, 250, (2, 17), generator=torch.Generator().manual_seed(0))


def logits(model, ctx) -> torch.Tensor:
    from rlhf_mcore.models.logprobs import full_logits

    model = model.module if hasattr(model, "module") else model
    with torch.no_grad():
        return full_logits(model, model(TOKENS, torch.arange(17).expand(2, 17), None), ctx.pgs.tp)


def test_export_of_a_lora_checkpoint_loads_in_transformers_and_peft(mcore_ctx, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf_dir = save_tiny(tmp_path / "base", "qwen2")
    cfg = Config(model=ModelConfig(hf_path=str(hf_dir), lora_rank=4, lora_alpha=8.0, attention_backend="sdpa"))
    hf = load_hf_config(cfg.model)
    model = build_model("actor", hf, cfg.model, cfg.parallel, mcore_ctx)
    load_hf_weights(model, str(hf_dir), hf, 0, 1)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # as after some updates: B != 0
        for _, p in adapter_parameters(model):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    ours = logits(model, mcore_ctx)
    path = save_checkpoint(tmp_path / "run", 2, {"actor": build_train_state(model, cfg.actor.optim, cfg.parallel)},
                           {}, mcore_ctx)
    out = Path(export_actor_to_hf(SimpleNamespace(cfg=cfg, run_dir=str(tmp_path / "run")), path))
    assert not (out / "adapter_config.json").exists(), "transformers would load the adapter's base instead"
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()(TOKENS).logits
        base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        plain = base(TOKENS).logits  # before peft injects the adapters into `base` in place
        peft = PeftModel.from_pretrained(base, str(out / ADAPTER_DIR)).eval()(TOKENS).logits
    errors = {"merged": (merged - ours).abs().max().item(), "peft": (peft - ours).abs().max().item(),
              "adapters' effect": (plain - ours).abs().max().item()}
    print(errors)
    assert errors["merged"] < 1e-5 and errors["peft"] < 1e-5 and errors["adapters' effect"] > 0.1, errors
    config = json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(hf_dir.resolve()) and config["r"] == 4

    # a new run from the exported adapter: the trainer's roles load it (model.lora_adapter_path)
    from rlhf_mcore.config.validate import validate
    from rlhf_mcore.trainer.roles import build_roles

    started = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_adapter_path=str(out / ADAPTER_DIR)))
    assert not [e for e in validate(started) if e.startswith("model.")]
    roles = build_roles(started, hf, mcore_ctx)
    assert torch.equal(logits(roles.actor.module, mcore_ctx), ours)
    wrong = dataclasses.replace(started, model=dataclasses.replace(started.model, lora_rank=8))
    assert any(e.startswith("model.lora_adapter_path: the adapter in ") and "Set model.lora_rank=4." in e
               for e in validate(wrong))
