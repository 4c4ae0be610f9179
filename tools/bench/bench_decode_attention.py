"""Decode attention of the native engine's graphed step: the split-KV Triton kernel against the SDPA path,
and both against the time to read the keys and values they must read once (the memory floor).

    python -m tools.bench.bench_decode_attention --out /tmp/bench                  # GPU
    python -m tools.bench.bench_decode_attention --device cpu --batch 4 --length 64 # CPU smoke (sdpa only)

Per shape (rows b, query heads H, key groups G, head dim D, cache length T, decode position pos; every
third row 7 slots behind, as ragged prompts put rows at their own columns): microseconds
per layer call (mean over a CUDA graph of `--layers` calls replayed `--iters` times, as the engine runs it),
the floor = bytes of K and V at slots <= pos / `--hbm-tbs`, and the error against the reference. The SDPA
path reads all T slots and builds its mask once per step (its cost is counted once per graph). Writes
OUT/decode_attention.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rlhf_mcore.kernels.decode_attention import HAS_TRITON, reference_decode_attention

from rlhf_mcore.rollout import decode_layer as fn

SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen2.5-7b": (28, 4, 128), "smollm2-135m": (9, 3, 64)}


def inputs(b, heads, groups, d, length, pos, device, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, heads, d, generator=g).to(device, dtype)
    k = torch.randn(b, groups, length, d, generator=g).to(device, dtype)
    v = torch.randn(b, groups, length, d, generator=g).to(device, dtype)
    rows = torch.full((b,), pos, dtype=torch.long)
    rows[::3] -= 7  # ragged prompts: each row at its own trainer column
    return q, k, v, rows.to(device)


def impls():
    out = {"sdpa": fn.DECODE_ATTENTION.get("sdpa")}
    if HAS_TRITON and torch.cuda.is_available():
        out["triton"] = fn.DECODE_ATTENTION.get("triton")
    return out


def time_us(entry, case, layers: int, iters: int, device) -> float:
    """Microseconds per layer call: one mask per step, `layers` attention calls, as in a decode step."""
    q, k, v, pos = case

    def run():
        mask = entry.mask(pos, k.size(2), k.dtype)
        for _ in range(layers):
            out = entry.attend(q[None], k, v, mask, 0.125)
        return out
    if device.type != "cuda":
        import time
        start = time.perf_counter()
        for _ in range(iters):
            run()
        return (time.perf_counter() - start) * 1e6 / (iters * layers)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / (iters * layers)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-7b", help=f"of {sorted(SHAPES)}")
    p.add_argument("--batch", default="64,512")
    p.add_argument("--length", type=int, default=384)
    p.add_argument("--positions", default="128,256,383")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--hbm-tbs", type=float, default=4.3, help="measured HBM bandwidth, TB/s")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("No CUDA device. CPU smoke run: --device cpu --batch 4 --length 64 --positions 63")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    print(f"{'shape':<14}{'b':>5}{'pos':>5}{'impl':>8}{'us/layer':>10}{'floor us':>10}{'x floor':>9}{'max err':>10}")
    for shape in args.shapes.split(","):
        heads, groups, d = SHAPES[shape]
        for b in map(int, args.batch.split(",")):
            for pos in map(int, args.positions.split(",")):
                case = inputs(b, heads, groups, d, args.length, pos, device, dtype)
                want = reference_decode_attention(*case[:3], None, case[3], 0.125).float()
                floor_us = 2 * b * groups * (pos + 1) * d * case[1].element_size() / (args.hbm_tbs * 1e12) * 1e6
                for name, entry in impls().items():
                    mask = entry.mask(case[3], args.length, dtype)
                    err = (entry.attend(case[0][None], case[1], case[2], mask, 0.125).view_as(want).float()
                           - want).abs().max().item()
                    us = time_us(entry, case, args.layers, args.iters, device)
                    rows.append({"shape": shape, "batch": b, "length": args.length, "pos": pos, "impl": name,
                                 "us_per_layer": us, "floor_us": floor_us, "x_floor": us / floor_us,
                                 "max_abs_err": err})
                    print(f"{shape:<14}{b:>5}{pos:>5}{name:>8}{us:>10.1f}{floor_us:>10.1f}{us / floor_us:>9.2f}"
                          f"{err:>10.1e}")
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dtype": str(dtype),
              "layers_per_graph": args.layers, "rows": rows}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_attention.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
