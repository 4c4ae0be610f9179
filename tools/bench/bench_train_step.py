"""Actor forward + backward step time, tokens/s, MFU and peak memory per attention backend, in one run.

    python -m tools.bench.bench_train_step --preset qwen2.5-0.5b --backends sdpa,local --seq-len 2048 \
        --micro-batch 8 --out /tmp/bench
    torchrun --nproc_per_node 4 -m tools.bench.bench_train_step --preset qwen2.5-7b --tp 2 --pp 2 --sp 1 \
        --dist-opt 1 --optimizer-step 1 --backends sdpa --seq-len 2048 --micro-batch 2 --num-micro 8

At TP x PP (x DP: the rest of torchrun's world) every DP rank runs its own batch; the figures are per GPU
(TFLOP/s and MFU of the model FLOPs of the world's tokens over world x peak) and the peak memory is the
largest rank's. --optimizer-step adds megatron's optimizer step (the update phase: fwd + bwd + step).

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
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.schedule import run_schedule, split_micro_batches

PRESETS = {
    "tiny": dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                 vocab_size=258, family="llama"),
    "qwen2.5-0.5b": dict(num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14,
                         num_query_groups=2, vocab_size=151936, tie_embeddings=True, family="qwen2"),
    "qwen2.5-7b": dict(num_layers=28, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28,
                       num_query_groups=4, vocab_size=152064, tie_embeddings=False, family="qwen2"),
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


def bench_backend(cfg: Config, ctx, backend: str, batch: dict, micro: int, steps: int, warmup: int,
                  with_step: bool = False) -> dict:
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
        if with_step:
            optimizer_step(state, cfg.actor.optim.lr)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    peak = torch.tensor(torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"))
    del state
    step = torch.tensor(sorted(times)[len(times) // 2])
    if torch.distributed.get_world_size() > 1:  # the slowest rank's median, the largest rank's peak
        for t in (step, peak):
            t_dev = t.to(ctx.device)
            torch.distributed.all_reduce(t_dev, op=torch.distributed.ReduceOp.MAX)
            t.copy_(t_dev.cpu())
    step, peak = step.item(), peak.item()
    tokens = batch["tokens"].numel() * ctx.dims.dp  # the world's tokens per step
    world = torch.distributed.get_world_size()
    return {"backend": backend, "step_s": step, "tokens_per_s": tokens / step, "peak_gib": peak,
            "tflops": model_flops_per_token(hf, batch["tokens"].size(1)) * tokens / step / world / 1e12}


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
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--sp", type=int, default=0, help="parallel.sequence_parallel (GPU, tp > 1)")
    parser.add_argument("--dist-opt", type=int, default=0, help="parallel.use_distributed_optimizer")
    parser.add_argument("--optimizer-step", type=int, default=0, help="1: time the optimizer step too")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    ctx = init_distributed(args.tp, args.pp, seed=1)
    parallel = ParallelConfig(tp=args.tp, pp=args.pp, sequence_parallel=bool(args.sp),
                              use_distributed_optimizer=bool(args.dist_opt))
    cfg = Config(model=ModelConfig(dtype=args.dtype, **PRESETS[args.preset]), parallel=parallel)
    batch = make_batch(args.micro_batch * args.num_micro, args.seq_len, PRESETS[args.preset]["vocab_size"], ctx.device)
    rows = []
    for backend in args.backends.split(","):
        try:
            rows.append(bench_backend(cfg, ctx, backend, batch, args.micro_batch, args.steps, args.warmup,
                                      with_step=bool(args.optimizer_step)))
        except torch.OutOfMemoryError as e:
            rows.append({"backend": backend, "error": f"OOM: {str(e)[:120]}"})
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    base = next((r for r in rows if "step_s" in r), None)
    if ctx.rank != 0:
        return
    print(f"{args.preset} {args.dtype} seq {args.seq_len} x micro-batch {args.micro_batch} x {args.num_micro}, "
          f"tp {args.tp} pp {args.pp} dp {ctx.dims.dp} (sp {args.sp}, distributed optimizer {args.dist_opt}, "
          f"optimizer step {'timed' if args.optimizer_step else 'off'})")
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
        layout = "" if args.tp * args.pp * ctx.dims.dp == 1 else f"_tp{args.tp}pp{args.pp}dp{ctx.dims.dp}"
        path = os.path.join(args.out, f"train_step_{args.preset}{layout}.json")
        with open(path, "w") as f:
            json.dump({"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "rows": rows}, f, indent=2)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
