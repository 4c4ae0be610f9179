"""The LoRA exports against transformers / peft, at one TP layout (tests/dist/models/test_lora_export.py runs it in
process at TP1 and under torchrun at TP2, gloo):

    torchrun --nproc_per_node 2 -m tests.worker lora_export --hf DIR --work DIR --tp 2
    torchrun --nproc_per_node 2 -m tests.worker lora_export --hf MOE_DIR --work DIR --tp 1 --ep 2

(an MoE checkpoint: every expert's gate / up / down adapters too, each EP rank holding half of them).

The actor (fp32, from the tiny HF checkpoint `--hf`) gets rank-4 adapters on every projection, with random
A and B (as after some updates: B != 0) read from one full PEFT adapter, so every layout holds the same ones.
Then, against the trainer's own logits of that actor (its forward with the adapters' hooks):
- merged: `FullWeights` -> `hf_weights` -> save_hf_checkpoint, loaded by transformers;
- peft: `lora_state_for_hf` -> save_peft_adapter, loaded by `peft.PeftModel.from_pretrained` onto the base;
- reload: a fresh actor started from that adapter (`load_peft_adapter`, model.lora_adapter_path).
Rank 0 prints `lora_export tp=N merged=E peft=E reload=E` (max |logit difference|).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.convert.mcore import build_for_conversion
from rlhf_mcore.models.full_weights import FullWeights, hf_weights
from rlhf_mcore.models.hf_io import read_hf_config, save_hf_checkpoint
from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.lora import LoraSettings, apply_lora, expand_targets
from rlhf_mcore.models.lora_export import (
    adapter_config,
    hf_module_names,
    load_peft_adapter,
    lora_state_for_hf,
    peft_key,
    save_peft_adapter,
)

SETTINGS = LoraSettings(rank=4, alpha=8.0, target_modules=expand_targets(["all-linear"]))
TOKENS = torch.randint(0, 250, (2, 17), generator=torch.Generator().manual_seed(0))


def random_adapter(hf_cfg: dict, settings: LoraSettings, seed: int = 1) -> dict[str, torch.Tensor]:
    """Full adapters under PEFT's names for every targeted HF module, A and B random (B as after training)."""
    gen = torch.Generator().manual_seed(seed)
    h = hf_cfg["hidden_size"]
    d = hf_cfg.get("head_dim") or h // hf_cfg["num_attention_heads"]
    q, kv = hf_cfg["num_attention_heads"] * d, hf_cfg["num_key_value_heads"] * d
    out = {}
    for (_, sub), module in sorted(hf_module_names(hf_cfg).items()):
        ffn = hf_cfg.get("moe_intermediate_size") if ".experts." in module else hf_cfg["intermediate_size"]
        shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (ffn, h),
                  "up_proj": (ffn, h), "down_proj": (h, ffn)}
        if sub in settings.target_modules:
            n_out, n_in = shapes[sub]
            out[peft_key(module, "A")] = torch.randn(settings.rank, n_in, generator=gen) * 0.2
            out[peft_key(module, "B")] = torch.randn(n_out, settings.rank, generator=gen) * 0.05
    return out


def lora_actor(hf_dir: Path, hf_cfg: dict, ctx, adapter_dir: Path | None):
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(model, str(hf_dir), hf_cfg, ctx.tp_rank, ctx.dims.tp)
    apply_lora(model, SETTINGS, ctx)
    if adapter_dir is not None:
        load_peft_adapter(model, str(adapter_dir), hf_cfg, ctx)
    return model.eval()


def trainer_logits(model, ctx) -> torch.Tensor:
    from rlhf_mcore.models.logprobs import full_logits

    pos = torch.arange(TOKENS.size(1)).unsqueeze(0).expand_as(TOKENS)
    with torch.no_grad():
        return full_logits(model, model(TOKENS, pos, None), ctx.pgs.tp)


def run(hf_dir: Path, work: Path, ctx) -> dict[str, float]:
    """The three checks of the module doc; errors on rank 0 (other ranks: {})."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rank0 = dist.get_rank() == 0
    hf_cfg = read_hf_config(hf_dir)
    tag = f"tp{ctx.dims.tp}" + (f"ep{ctx.dims.ep}" if ctx.dims.ep > 1 else "")
    seeded = work / f"seed_adapter_{tag}"
    if rank0:
        save_peft_adapter(seeded, random_adapter(hf_cfg, SETTINGS), adapter_config(SETTINGS, str(hf_dir)))
    dist.barrier()
    model = lora_actor(hf_dir, hf_cfg, ctx, seeded)
    ours = trainer_logits(model, ctx)
    merged = dict(hf_weights(FullWeights(model, ctx), hf_cfg))  # collective
    adapter = lora_state_for_hf(model, hf_cfg, ctx)  # collective
    out_merged, out_peft = work / f"merged_{tag}", work / f"peft_{tag}"
    if rank0:
        save_hf_checkpoint(out_merged, merged, hf_cfg, overwrite=True)
        save_peft_adapter(out_peft, adapter, adapter_config(SETTINGS, str(hf_dir)))
    dist.barrier()
    reloaded = trainer_logits(lora_actor(hf_dir, hf_cfg, ctx, out_peft), ctx)
    if not rank0:
        return {}
    with torch.no_grad():
        hf_merged = AutoModelForCausalLM.from_pretrained(str(out_merged), dtype=torch.float32).eval()
        base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        hf_peft = PeftModel.from_pretrained(base, str(out_peft)).eval()
        return {"merged": (hf_merged(TOKENS).logits - ours).abs().max().item(),
                "peft": (hf_peft(TOKENS).logits - ours).abs().max().item(),
                "reload": (reloaded - ours).abs().max().item(),
                "lora_effect": (AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()(TOKENS).logits
                                - ours).abs().max().item()}


def main(argv: list[str]) -> int:
    from rlhf_mcore.logs import init_logger
    from rlhf_mcore.parallel import destroy_distributed, init_distributed, torchrun_env

    parser = argparse.ArgumentParser()
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--ep", type=int, default=1)
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    ctx = init_distributed(args.tp, 1, ep=args.ep)
    errors = run(args.hf, args.work, ctx)
    if errors:
        print(f"lora_export tp={args.tp} ep={args.ep} " + " ".join(f"{k}={v:.3e}" for k, v in errors.items()),
              flush=True)
    destroy_distributed()
    return 0


def entry(argv: list[str]) -> int:
    return main(argv)
