"""Decode throughput of the native rollout engine (KV-cache generation with the actor's megatron modules).

    python -m tools.bench.bench_rollout                                   # tiny test model, this device
    python -m tools.bench.bench_rollout --preset qwen2.5-0.5b --dtype bf16 --batch 1,16,64,256 --out results
    torchrun --nproc_per_node 2 -m tools.bench.bench_rollout --preset llama3.2-1b --tp 2 --dtype bf16
    python -m tools.bench.bench_rollout --hf-path /models/Qwen2.5-1.5B --dtype bf16   # architecture only
    python -m tools.bench.bench_rollout --hf-path DIR --moe-expert-impl grouped   # an MoE (eager decode)

Weights are random (only the architecture matters for speed); no stop tokens, so every row decodes exactly
--new-tokens tokens. For each batch size it times a prefill-only call (max_new_tokens=1) and a full call;
decode tok/s = batch * (new_tokens - 1) / (full - prefill), per DP replica. Prints a table on rank 0 and,
with --out DIR, writes DIR/rollout_<preset>_tp<T>pp<P>.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig
from rlhf_mcore.models.build import build_model, count_parameters
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams

PRESETS = {  # ModelConfig fields of public architectures (hidden, layers, heads as published)
    "tiny": dict(num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                 vocab_size=250),
    "qwen2.5-0.5b": dict(family="qwen2", num_layers=24, hidden_size=896, ffn_hidden_size=4864,
                         num_attention_heads=14, num_query_groups=2, vocab_size=151936, tie_embeddings=True),
    "qwen2.5-1.5b": dict(family="qwen2", num_layers=28, hidden_size=1536, ffn_hidden_size=8960,
                         num_attention_heads=12, num_query_groups=2, vocab_size=151936, tie_embeddings=True),
    "llama3.2-1b": dict(num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                        num_query_groups=8, vocab_size=128256, tie_embeddings=True, rope_theta=500000.0),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--hf-path", default="", help="read the architecture from this HF dir (overrides --preset)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--batch", default="1,8,32", help="comma-separated numbers of sequences per replica")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--micro-batch-size", type=int, default=0, help="engine micro-batch (0 = all rows)")
    p.add_argument("--ragged", action="store_true", help="prompt lengths uniform in [prompt_len/2, prompt_len]")
    p.add_argument("--repeat", type=int, default=2, help="timed repetitions (best is reported)")
    p.add_argument("--moe-expert-impl", default="auto", help="model.moe_expert_impl of an MoE model")
    p.add_argument("--decode-attention", default="auto", help="rollout.native.decode_attention")
    p.add_argument("--out", default="", help="directory for the JSON result")
    return p.parse_args(argv)


def make_prompts(num: int, length: int, vocab: int, ragged: bool, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length // 2), length + 1, (num,), generator=g) if ragged else [length] * num
    return [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in lengths]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_generate(engine, prompts, params, device, repeat: int) -> float:
    """Best wall time of `repeat` generate() calls, after one warm-up call."""
    engine.generate(prompts, params)
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        engine.generate(prompts, params)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def bench_batch(engine, ctx, args, batch: int, vocab: int) -> dict:
    prompts = make_prompts(batch, args.prompt_len, vocab, args.ragged, seed=batch)
    full = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature, seed=1)
    prefill = SamplingParams(max_new_tokens=1, temperature=args.temperature, seed=1)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t_prefill = timed_generate(engine, prompts, prefill, ctx.device, args.repeat)
    t_full = timed_generate(engine, prompts, full, ctx.device, args.repeat)
    decode_s = max(t_full - t_prefill, 1e-9)
    decode_tokens = batch * (args.new_tokens - 1)
    return {
        "batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "prefill_s": t_prefill, "decode_s": decode_s, "total_s": t_full,
        "decode_tok_s": decode_tokens / decode_s, "total_tok_s": batch * args.new_tokens / t_full,
        "ms_per_step": 1e3 * decode_s / max(args.new_tokens - 1, 1),
        "prefill_tok_s": sum(len(p) for p in prompts) / t_prefill,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if ctx.device.type == "cuda" else None,
    }


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    cols = ["batch", "prompt_len", "new_tokens", "prefill_s", "decode_s", "ms_per_step", "decode_tok_s",
            "total_tok_s", "peak_mem_gib"]
    print("  ".join(f"{c:>12}" for c in cols))
    for row in rows:
        cells = [row[c] for c in cols]
        print("  ".join(f"{v:>12.4g}" if isinstance(v, float) else f"{str(v):>12}" for v in cells))


def main(argv=None) -> None:
    args = parse_args(argv)
    model_cfg = ModelConfig(hf_path=args.hf_path, dtype=args.dtype, moe_expert_impl=args.moe_expert_impl) \
        if args.hf_path else ModelConfig(dtype=args.dtype, **PRESETS[args.preset])
    cfg = Config(model=model_cfg, parallel=ParallelConfig(tp=args.tp, pp=args.pp))
    ctx = init_distributed(args.tp, args.pp, seed=1234)
    hf = load_hf_config(cfg.model)
    if args.hf_path and ctx.device.type == "cuda":  # random weights drawn on the GPU (seconds, not minutes)
        from tools.bench.bench_moe_step import build_fast

        model, _ = build_fast("actor", hf, cfg.model, cfg.parallel, ctx)
    else:
        model = build_model("actor", hf, cfg.model, cfg.parallel, ctx)
    engine = NativeRolloutEngine(model, ctx, pad_id=0, micro_batch_size=args.micro_batch_size,
                                 decode_attention=args.decode_attention)
    rows = [bench_batch(engine, ctx, args, int(b), hf["vocab_size"]) for b in args.batch.split(",")]
    if ctx.rank != 0:
        return
    name = Path(args.hf_path).name if args.hf_path else args.preset
    if hf.get("num_experts") or hf.get("num_local_experts"):
        name += f"_{args.moe_expert_impl}"
    device = torch.cuda.get_device_name() if ctx.device.type == "cuda" else f"cpu x{torch.get_num_threads()}"
    header = (f"native rollout: {name} {args.dtype} tp{args.tp} pp{args.pp} dp{ctx.dims.dp} on {device}; "
              f"{count_parameters(model) / 1e6:.1f}M params on rank 0; tok/s per DP replica")
    print_table(rows, header)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"rollout_{name}_tp{args.tp}pp{args.pp}.json"
        result = {"model": name, "dtype": args.dtype, "tp": args.tp, "pp": args.pp, "dp": ctx.dims.dp,
                  "device": device, "temperature": args.temperature, "ragged": args.ragged,
                  "micro_batch_size": args.micro_batch_size, "moe_expert_impl": args.moe_expert_impl,
                  "decode_path": "static" if engine.static is not None else "eager", "rows": rows}
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
