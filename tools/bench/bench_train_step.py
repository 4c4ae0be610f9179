"""Actor forward + backward step time, tokens/s, MFU and peak memory per attention backend, in one run.

    python -m tools.bench.bench_train_step --preset qwen2.5-0.5b --backends sdpa,local --seq-len 2048 \
        --micro-batch 8 --out tools/bench/results

The step is the real actor path: megatron's schedule, the PPO loss on fused vocab-parallel log-probs,
megatron DDP, gradient finalisation (no optimizer step). MFU = model FLOPs / time / peak, with model FLOPs
= 6 * matmul params * tokens + 6 * layers * hidden * seq * tokens (causal attention, fwd + bwd), and
peak = 790 TFLOP/s (measured bf16 dense on the H200) unless --peak-tflops says otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from functools import partial

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state, zero_grads
from rlhf_mcore.trainer.schedule import run_schedule, split_micro_batches

PRESETS = {
    "tiny": dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                 vocab_size=258, family="llama"),
    "qwen2.5-0.5b": dict(num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14,
                         num_query_groups=2, vocab_size=151936, tie_embeddings=True, family="qwen2"),
    "smollm2-135m": dict(num_layers=30, hidden_size=576, ffn_hidden_size=1536, num_attention_heads=9,
                         num_query_groups=3, vocab_size=49152, tie_embeddings=True, family="llama"),
}


def model_flops_per_token(hf: dict, seq: int) -> float:
    h, layers, ffn, v = hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"], hf["vocab_size"]
    kv = hf["num_key_value_heads"] * h // hf["num_attention_heads"]
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * ffn  # q, o, k, v, gate/up/down
    matmul_params = layers * per_layer + h * v  # + LM head
    return 6 * matmul_params + 6 * layers * h * seq


def make_batch(num: int, seq: int, vocab: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(num, seq)
    mask[:, seq // 4:] = 1.0
    return {k: v.to(device) for k, v in {
        "tokens": torch.randint(0, vocab, (num, seq), generator=g), "lengths": torch.full((num,), seq),
        "response_mask": mask, "old_logp": -torch.rand(num, seq, generator=g) * 5,
        "advantages": torch.randn(num, seq, generator=g)}.items()}


def bench_backend(cfg: Config, ctx, backend: str, batch: dict, micro: int, steps: int, warmup: int) -> dict:
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_backend=backend))
    hf = load_hf_config(cfg.model)
    state = build_train_state(build_model("actor", hf, cfg.model, cfg.parallel, ctx), cfg.actor.optim, cfg.parallel)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=float(batch["tokens"].size(1)))
    mbs = split_micro_batches(batch, micro)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        zero_grads(state)
        run_schedule(state.model, mbs, fn, forward_only=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    del state
    step = sorted(times)[len(times) // 2]
    tokens = batch["tokens"].numel()
    return {"backend": backend, "step_s": step, "tokens_per_s": tokens / step, "peak_gib": peak,
            "tflops": model_flops_per_token(hf, batch["tokens"].size(1)) * tokens / step / 1e12}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--backends", default="sdpa,local")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--num-micro", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    ctx = init_distributed(1, 1, seed=1)
    cfg = Config(model=ModelConfig(dtype=args.dtype, **PRESETS[args.preset]), parallel=ParallelConfig())
    batch = make_batch(args.micro_batch * args.num_micro, args.seq_len, PRESETS[args.preset]["vocab_size"], ctx.device)
    rows = []
    for backend in args.backends.split(","):
        try:
            rows.append(bench_backend(cfg, ctx, backend, batch, args.micro_batch, args.steps, args.warmup))
        except torch.OutOfMemoryError as e:
            rows.append({"backend": backend, "error": f"OOM: {str(e)[:120]}"})
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    base = next((r for r in rows if "step_s" in r), None)
    print(f"{args.preset} {args.dtype} seq {args.seq_len} x micro-batch {args.micro_batch} x {args.num_micro}")
    print(f"{'backend':<8}{'step s':>9}{'tokens/s':>11}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}{'speed vs first':>16}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<8} {r['error']}")
            continue
        r["mfu"] = r["tflops"] / args.peak_tflops
        r["speed_vs_first"] = base["step_s"] / r["step_s"]
        print(f"{r['backend']:<8}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}{r['tflops']:>9.1f}{r['mfu']:>7.1%}"
              f"{r['peak_gib']:>10.1f}{r['speed_vs_first']:>15.2f}x")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"train_step_{args.preset}.json")
        with open(path, "w") as f:
            json.dump({"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "rows": rows}, f, indent=2)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
