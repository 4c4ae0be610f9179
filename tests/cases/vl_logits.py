"""torchrun worker of tests/dist/models/test_qwen2_5_vl_layouts.py: a tiny HF Qwen2.5-VL directory loaded straight
into our model at tensor parallelism --tp (the LM split, the vision tower whole on every rank), fp32 logits of the
image batch of tests/support/tiny_vl.py against transformers'. Prints `vl tp=N rank=R logits_max=X` per rank;
exits 1 past 1e-5."""
from __future__ import annotations

import argparse

import torch

from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.logprobs import full_logits
from rlhf_mcore.models.vision import build_vision_lm, vision_lm_forward
from rlhf_mcore.parallel import destroy_distributed, init_distributed, torchrun_env
from tests.support.tiny_vl import image_batch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--tp", type=int, required=True)
    args = parser.parse_args(argv)
    init_logger(torchrun_env()[0])
    ctx = init_distributed(args.tp, 1)
    from transformers import AutoModelForImageTextToText

    vlm = build_vision_lm(args.hf_dir, "actor", ModelConfig(dtype="fp32", attention_backend="sdpa"),
                          ParallelConfig(tp=args.tp, pp=1), ctx)
    hf = AutoModelForImageTextToText.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    batch = image_batch()
    with torch.no_grad():
        want = hf(**batch).logits
        hidden = vision_lm_forward(vlm, batch["input_ids"], batch["pixel_values"], batch["image_grid_thw"],
                                   batch["attention_mask"])
        got = full_logits(vlm.lm, hidden, ctx.pgs.tp)
    err = (want - got).abs()[batch["attention_mask"].bool()].max().item()
    print(f"vl tp={args.tp} rank={ctx.rank} logits_max={err:.3e}", flush=True)
    destroy_distributed()
    return int(err > 1e-5)


def entry(argv: list[str]) -> int:
    return main(argv)
