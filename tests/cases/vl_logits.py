"""torchrun worker of tests/dist/models/test_hf_layouts.py: a tiny HF Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE directory
loaded straight into our model at tensor parallelism --tp (the LM split, the vision tower whole on every rank) or
expert parallelism --ep (an MoE's experts split, tokens exchanged by the dispatcher), fp32 logits of the image batch
of tests/support/tiny_vl.py against transformers'; then the trainer's old-log-prob pass (the actor, DDP-wrapped,
through trainer/schedule.py, padded and packed micro-batches) against transformers' log-probs, at --tp / --ep or at
pipeline parallelism --pp (the tower on the first stage, M-RoPE positions on every stage; the direct logits check is
TP/EP only). Prints `vl FAMILY tp=N[ ep=E] rank=R logits_max=X` and `vl FAMILY train tp=N pp=M[ ep=E] rank=R
logp_max=X` per rank (FAMILY: config.json's model_type; ep shown past 1); exits 1 past 1e-5."""
from __future__ import annotations

import argparse

import torch

from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.models.vision import build_vision_lm, vision_lm_forward
from rlhf_mcore.parallel import destroy_distributed, init_distributed, torchrun_env
from tests.support.tiny_vl import FAMILIES, image_batch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    ctx = init_distributed(args.tp, args.pp, ep=args.ep)
    ep = f" ep={args.ep}" if args.ep > 1 else ""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    family = hf.config.model_type
    patch_dim = FAMILIES[family][1]
    batch = image_batch(0, patch_dim)
    with torch.no_grad():
        want = hf(**batch).logits
    err = 0.0
    if args.pp == 1:
        vlm = build_vision_lm(args.hf_dir, "actor", ModelConfig(dtype="fp32", attention_backend="sdpa"),
                              ParallelConfig(tp=args.tp, pp=1, ep=args.ep), ctx)
        with torch.no_grad():
            hidden = vision_lm_forward(vlm, batch["input_ids"], batch["pixel_values"], batch["image_grid_thw"],
                                       batch["attention_mask"])
            got = full_logits(vlm.lm, hidden, ctx.pgs.tp)
        err = (want - got).abs()[batch["attention_mask"].bool()].max().item()
        print(f"vl {family} tp={args.tp}{ep} rank={ctx.rank} logits_max={err:.3e}", flush=True)
    train_err = trainer_logp_error(args.hf_dir, ctx, want, batch, patch_dim)
    print(f"vl {family} train tp={args.tp} pp={args.pp}{ep} rank={ctx.rank} logp_max={train_err:.3e}", flush=True)
    destroy_distributed()
    return int(max(err, train_err) > 1e-5)


def trainer_logp_error(hf_dir: str, ctx, logits: torch.Tensor, batch: dict, patch_dim: int) -> float:
    """Max |trainer old log-probs - transformers'| over padded and packed micro-batches."""
    from functools import partial
    from pathlib import Path

    from rlhf_mcore.trainer.losses import actor_loss
    from rlhf_mcore.trainer.schedule import forward_collect, split_micro_batches
    from tests.support.tiny_vl import vl_actor, vl_step_batch

    want = torch.nn.functional.pad(torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch["input_ids"][:, 1:, None])[..., 0], (1, 0))
    cfg, state = vl_actor(Path(hf_dir), ctx)
    sb = vl_step_batch(0, patch_dim)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=16.0)
    errs = []
    for split in ({"micro_batch_size": 2}, {"micro_batch_size": 2, "max_tokens": 20, "pack": True}):
        got = forward_collect(state.model, split_micro_batches(sb, **split), fn, ("logp",), sb["tokens"].size(1),
                              ctx.pgs.pp)["logp"]
        errs.append(float((got - want).abs()[sb["response_mask"].bool()].max()))
    return max(errs)


def entry(argv: list[str]) -> int:
    return main(argv)
