"""Benchmark fused chunked log-prob/entropy against full logits + log_softmax (forward + backward).

    python -m tools.bench.bench_fused_logprob --out /tmp/bench               # GPU, the default problem
    python -m tools.bench.bench_fused_logprob --device cpu --batch 2 --seq 64 --vocab 4096 --hidden 64

Default problem: Qwen2.5-0.5B-like head, vocab 151936, hidden 896, 8 x 2048 tokens, bf16. Prints a table
(milliseconds per forward+backward, peak memory above the inputs, error against the unfused result) and,
with --out DIR, writes DIR/fused_logprob.json. Needs only torch (and triton for the triton row).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rlhf_mcore.kernels.fused_logprob import HAS_TRITON, fused_logprob_entropy

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def unfused_logprob_entropy(hidden, weight, targets, temperature=1.0):
    """What a trainer does without the kernel: full logits in the model dtype, fp32 log_softmax."""
    logits = (hidden @ weight.t()).float() / temperature  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def step(fn, hidden, weight, targets, coef):
    """One forward + backward; returns (logp, entropy, d_hidden, d_weight)."""
    hidden.grad, weight.grad = None, None
    logp, entropy = fn(hidden, weight, targets)
    ((logp * coef[0]).sum() + (entropy * coef[1]).sum()).backward()
    return logp.detach(), entropy.detach(), hidden.grad, weight.grad


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn, inputs, device, warmup: int, iters: int) -> dict:
    """Mean ms per step and peak memory (MiB) above what was allocated before the first step."""
    for _ in range(warmup):
        out = step(fn, *inputs)
    del out
    sync(device)
    base = 0
    if device.type == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(iters):
        out = step(fn, *inputs)
    sync(device)
    ms = (time.perf_counter() - start) * 1e3 / iters
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else None
    return {"ms": ms, "peak_mib": peak, "out": out}


def errors(out, ref) -> dict:
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    return {"logp_max_abs": (out[0] - ref[0]).abs().max().item(),
            "entropy_max_abs": (out[1] - ref[1]).abs().max().item(),
            "d_hidden_rel": rel(out[2], ref[2]), "d_weight_rel": rel(out[3], ref[3])}


def build_inputs(args, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    n, dtype = args.batch * args.seq, DTYPES[args.dtype]
    hidden = (torch.randn(n, args.hidden, generator=g) * 0.5).to(device, dtype).requires_grad_(True)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).to(device, dtype).requires_grad_(True)
    targets = torch.randint(0, args.vocab, (n,), generator=g).to(device)
    coef = (torch.randn(2, n, generator=g) / n).to(device)
    return hidden, weight, targets, coef


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None, help="directory for fused_logprob.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("No CUDA device. For a CPU smoke run: --device cpu --batch 2 --seq 64 --vocab 4096 --hidden 64")

    inputs = build_inputs(args, device)
    impls = {"unfused": unfused_logprob_entropy,
             "fused_torch": lambda h, w, t: fused_logprob_entropy(h, w, t, chunk_size=args.chunk_size,
                                                                  backend="torch")}
    if HAS_TRITON and device.type == "cuda":
        impls["fused_triton"] = lambda h, w, t: fused_logprob_entropy(h, w, t, chunk_size=args.chunk_size,
                                                                      backend="triton")
    rows, ref = {}, None
    for name, fn in impls.items():
        res = measure(fn, inputs, device, args.warmup, args.iters)
        out = res.pop("out")
        ref = out if ref is None else ref
        rows[name] = {**res, **errors(out, ref)}
        del out

    print(f"fused log-prob/entropy fwd+bwd: {args.batch}x{args.seq} tokens, hidden {args.hidden}, "
          f"vocab {args.vocab}, {args.dtype}, chunk {args.chunk_size}, {device}")
    print(f"{'impl':<14}{'ms':>10}{'peak MiB':>12}{'logp err':>11}{'ent err':>10}{'dh rel':>10}{'dW rel':>10}")
    for name, r in rows.items():
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "n/a"
        print(f"{name:<14}{r['ms']:>10.2f}{peak:>12}{r['logp_max_abs']:>11.2e}{r['entropy_max_abs']:>10.2e}"
              f"{r['d_hidden_rel']:>10.2e}{r['d_weight_rel']:>10.2e}")
    result = {"config": {k: str(v) for k, v in vars(args).items()},
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "results": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fused_logprob.json").write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out / 'fused_logprob.json'}")
    return result


if __name__ == "__main__":
    main()
