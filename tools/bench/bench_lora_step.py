"""LoRA vs full fine-tuning GRPO-like steps on one GPU (issue 25): a Qwen2.5-7B shape (random weights, bf16)
with rank-32 adapters on every linear, against full fine-tuning of the same shape cut to the layers that fit.

    python -m tools.bench.bench_lora_step --out results/     # one H200, < 170 s
    python -m tools.bench.bench_lora_step --tiny --out /tmp  # CPU smoke test (fp32, tiny shapes), seconds

Per model, the two phases of a GRPO step the trainer runs: `log_prob` (forward only: the old log-probs; with
LoRA the KL reference is the same forward with the adapters off, so it costs the same in both and is left out)
and `update` (megatron's schedule, forward + backward of the PPO loss on fused log-probs, gradient
finalisation, megatron's distributed optimizer step). `grpo step` = log_prob + update. Median of --steps after
--warmup. Runs, in order (each written to lora_step.json as it ends; a run that would pass --budget-s is
skipped and says so):
1. LoRA on the whole 28-layer shape;
2. LoRA on the first N layers of that same model (layers dropped, the adapters' optimizer rebuilt): N = the
   most layers full fine-tuning fits (tools/bench/moe_memory.py's estimate at 18 B/param + activations, 85% of
   the device), so 2 and 3 compare like for like;
3. full fine-tuning of N layers.
Model FLOPs (MFU against --peak-tflops, 790: the H200's measured bf16 dense rate): forward 2 per weight and
token plus attention (models/flops.py); full update 3x the forward; LoRA update: the frozen base's forward and
its backward through the activations (2 + 2 per weight and token, no weight gradient), attention 3x, and the
adapters' 6 per adapter weight and token.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from functools import partial

import torch

from rlhf_mcore.config import ActorConfig, ModelConfig, OptimConfig, ParallelConfig
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model, count_parameters
from rlhf_mcore.models.flops import forward_flops_per_token
from rlhf_mcore.models.lora import adapter_parameters
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state
from rlhf_mcore.trainer.schedule import run_schedule, split_micro_batches
from tools.bench.bench_moe_step import capacity_bytes, free_memory, peak_gib, time_phase, update_fn
from tools.bench.bench_train_step import make_batch
from tools.bench.moe_memory import GIB, largest_layers

QWEN7B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_hidden_layers=28, hidden_size=3584,
              intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
              tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096,
              hidden_act="silu")
log = logging.getLogger(__name__)
TINY = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=300)


def attention_flops_per_token(hf: dict, seq: float) -> float:
    """QK^T and AV of one token's forward (models/flops.py's attention term)."""
    q = hf["num_attention_heads"] * (hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    return 4.0 * hf["num_hidden_layers"] * q * seq


def phase_flops_per_token(hf: dict, seq: float, phase: str, adapters: int) -> float:
    """Model FLOPs per token of a phase; adapters = trainable adapter weights (0: full fine-tuning).

    >>> hf = {"hidden_size": 4, "num_hidden_layers": 1, "intermediate_size": 8, "num_attention_heads": 2,
    ...       "num_key_value_heads": 1, "vocab_size": 10}
    >>> phase_flops_per_token(hf, 3, "update", 0), phase_flops_per_token(hf, 3, "update", 5)
    (1248.0, 910.0)

    (3 x 416; 2 x 368 weight FLOPs + 3 x 48 attention + 6 x 5 adapter.)
    """
    forward = forward_flops_per_token(hf, seq)
    if phase == "log_prob":
        return forward + 2.0 * adapters
    if not adapters:
        return 3.0 * forward
    attention = attention_flops_per_token(hf, seq)
    return 2.0 * (forward - attention) + 3.0 * attention + 6.0 * adapters


def bench_state(label: str, model, hf: dict, ctx, args, batch: dict, build_s: float, init: str) -> list[dict]:
    """log_prob and update rows of one model (its train state built here, freed on return)."""
    actor_cfg = ActorConfig(optim=OptimConfig(lr=1e-5))
    parallel = ParallelConfig(use_distributed_optimizer=True)
    free_memory()
    start = time.perf_counter()
    state = build_train_state(model, actor_cfg.optim, parallel)
    build_s += time.perf_counter() - start
    adapters = sum(p.numel() for _, p in adapter_parameters(model))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    common = {"model": label, "layers": hf["num_hidden_layers"], "params_b": count_parameters(model) / 1e9,
              "trainable_m": trainable / 1e6, "build_s": build_s, "init": init,
              "after_build_gib": torch.cuda.memory_allocated() / GIB if torch.cuda.is_available() else float("nan")}
    loss_fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=actor_cfg, temperature=1.0,
                      norm_length=float(batch["tokens"].size(1)))
    mbs = split_micro_batches(batch, args.micro_batch)
    tokens, seq = batch["tokens"].numel(), batch["tokens"].size(1)
    peaks = {}

    def log_prob():
        with torch.no_grad():
            run_schedule(state.model, mbs, partial(loss_fn, non_loss_data=True), forward_only=True)

    update = update_fn(state, mbs, loss_fn, actor_cfg.optim.lr, peaks)

    rows = []
    peak_gib(reset=True)
    seconds, _ = time_phase(log_prob, args.warmup, args.steps)
    rows.append({**common, **row("log_prob", hf, seconds, tokens, seq, adapters, peak_gib(reset=True), args)})
    seconds, loss = time_phase(update, args.warmup, args.steps)
    peak = max(peaks.values()) if torch.cuda.is_available() else float("nan")
    rows.append({**common, "loss": loss, "peak_fwd_bwd_gib": peaks["fwd_bwd"], "peak_optimizer_gib": peaks["optimizer"],
                 **row("update", hf, seconds, tokens, seq, adapters, peak, args)})
    step = rows[0]["step_s"] + rows[1]["step_s"]
    rows.append({**common, "phase": "grpo step", "step_s": step, "tokens_per_s": tokens / step,
                 "tflops": (rows[0]["tflops"] * rows[0]["step_s"] + rows[1]["tflops"] * rows[1]["step_s"]) / step,
                 "peak_gib": max(rows[0]["peak_gib"], rows[1]["peak_gib"])})
    rows[-1]["mfu"] = rows[-1]["tflops"] / args.peak_tflops
    return rows  # the train state goes with this frame (safe frees the memory)


def row(phase: str, hf: dict, seconds: float, tokens: int, seq: int, adapters: int, peak: float, args) -> dict:
    flops = phase_flops_per_token(hf, seq, phase, adapters) * tokens
    return {"phase": phase, "step_s": seconds, "tokens_per_s": tokens / seconds, "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / (args.peak_tflops * 1e12), "peak_gib": peak}


@contextlib.contextmanager
def gpu_initialization():
    """Random weights drawn on the GPU (megatron's CUDA RNG tracker) instead of the trainer's layout-invariant
    CPU draw: seconds instead of minutes for a 7B model; the numbers of a speed benchmark do not care."""
    import rlhf_mcore.models.build as build_module

    original = build_module.to_transformer_config

    def on_gpu(*a, **k):
        tc = original(*a, **k)
        tc.use_cpu_initialization = False
        return tc

    build_module.to_transformer_config = on_gpu
    try:
        yield
    finally:
        build_module.to_transformer_config = original


def build(hf: dict, args, ctx, lora: bool):
    """(model, build seconds, where its weights were drawn)."""
    cfg = ModelConfig(dtype=args.dtype, attention_backend="auto", lora_rank=args.rank if lora else 0,
                      lora_alpha=float(2 * args.rank), target_modules=["all-linear"])
    parallel = ParallelConfig(use_distributed_optimizer=True)
    free_memory()
    start = time.perf_counter()
    if torch.cuda.is_available() and not args.cpu_init:
        try:
            with gpu_initialization():
                return build_model("actor", hf, cfg, parallel, ctx), time.perf_counter() - start, "gpu"
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # the trainer's CPU initialisation always works
            log.warning("GPU initialisation failed (%s: %s); drawing the weights on the CPU", type(e).__name__, e)
            free_memory()
    return build_model("actor", hf, cfg, parallel, ctx), time.perf_counter() - start, "cpu"


def keep_layers(model, num: int) -> None:
    """Cut a built model to its first `num` decoder layers (a smaller model of the same shape, same weights)."""
    model.decoder.layers = model.decoder.layers[:num]
    model.config.num_layers = num


def safe(fn, label: str, layers: int) -> list[dict]:
    try:
        return fn()
    except torch.OutOfMemoryError as e:
        return [{"model": label, "layers": layers, "error": f"OOM: {str(e)[:160]}"}]
    finally:
        free_memory()


def print_table(rows: list[dict], args, notes: list[str]) -> None:
    print(f"{args.dtype}, {args.sequences} x {args.seq_len} tokens per step, micro-batch {args.micro_batch}, "
          f"LoRA rank {args.rank} all-linear; MFU of model FLOPs vs {args.peak_tflops:.0f} TFLOP/s")
    print(f"{'model':<6}{'layers':>7}{'params B':>9}{'train M':>9}{'phase':>11}{'step s':>9}{'tokens/s':>10}"
          f"{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}")
    for r in rows:
        if "error" in r or "skipped" in r:
            print(f"{r['model']:<6}{r['layers']:>7}  {r.get('error') or r['skipped']}")
            continue
        print(f"{r['model']:<6}{r['layers']:>7}{r['params_b']:>9.2f}{r['trainable_m']:>9.1f}{r['phase']:>11}"
              f"{r['step_s']:>9.3f}{r['tokens_per_s']:>10.0f}{r['tflops']:>9.1f}{r['mfu']:>7.1%}{r['peak_gib']:>10.1f}")
    for line in notes:
        print(line)


def write_result(args, rows: list[dict], notes: list[str]) -> None:
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "lora_step_tiny.json" if args.tiny else "lora_step.json"), "w") as f:
            json.dump({"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "torch": torch.__version__, "rows": rows, "notes": notes}, f, indent=2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny fp32 shapes, 4 x 32 tokens (CPU smoke test)")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--full-layers", type=int, default=0, help="layers of the full fine-tuning run (0: estimate)")
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--budget-s", type=float, default=150.0, help="skip a run that would end after this")
    p.add_argument("--capacity-gib", type=float, default=0, help="device memory for the estimate (0: the device's)")
    p.add_argument("--cpu-init", action="store_true", help="draw the weights on the CPU, as the trainer does")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    args.dtype = "fp32" if args.tiny else "bf16"
    if args.tiny:
        args.sequences, args.seq_len, args.micro_batch, args.steps, args.warmup = 4, 32, 2, 1, 0
    return args


def full_layer_count(hf: dict, args) -> int:
    """Layers of the full fine-tuning run: --full-layers, else the most whose estimate fits 85% of the device
    (2 for --tiny)."""
    if args.full_layers or args.tiny:
        return args.full_layers or 2
    return min(hf["num_hidden_layers"], largest_layers(hf, args.micro_batch * args.seq_len,
                                                       0.85 * capacity_bytes(args)))


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    init_logger()
    start = time.perf_counter()
    ctx = init_distributed(1, 1, seed=1)
    hf = {**QWEN7B, **(TINY if args.tiny else {})}
    layers = hf["num_hidden_layers"]
    full_layers = full_layer_count(hf, args)
    why = "given" if args.full_layers else "the most that fit by estimate: 18 B/param + activations, 85% of the device"
    notes = [f"full fine-tuning: {full_layers} of {layers} layers ({why})"]
    batch = make_batch(args.sequences, args.seq_len, hf["vocab_size"], ctx.device)
    rows: list[dict] = []
    model, build_s, init = build(hf, args, ctx, lora=True)
    rows += safe(partial(bench_state, "lora", model, hf, ctx, args, batch, build_s, init), "lora", layers)
    write_result(args, rows, notes)
    first_s = time.perf_counter() - start
    if 0 < full_layers < layers:
        keep_layers(model, full_layers)
        cut = {**hf, "num_hidden_layers": full_layers}
        rows += safe(partial(bench_state, "lora", model, cut, ctx, args, batch, 0.0, init), "lora", full_layers)
    del model
    free_memory()
    write_result(args, rows, notes)
    cut = {**hf, "num_hidden_layers": full_layers}
    elapsed = time.perf_counter() - start
    if not full_layers:
        rows.append({"model": "full", "layers": 0, "skipped": "skipped: not one layer fits by estimate"})
    elif elapsed + first_s * full_layers / layers * 1.3 > args.budget_s:  # a full run costs about a LoRA one
        rows.append({"model": "full", "layers": full_layers, "skipped": f"skipped: {elapsed:.0f} s used of "
                     f"--budget-s {args.budget_s:.0f}, the run needs ~{first_s * full_layers / layers * 1.3:.0f} s"})
    else:
        def full_run():
            model, build_s, init = build(cut, args, ctx, lora=False)
            return bench_state("full", model, cut, ctx, args, batch, build_s, init)

        rows += safe(full_run, "full", full_layers)
    same = {r["model"]: r for r in rows if r.get("layers") == full_layers and r.get("phase") == "grpo step"}
    if {"lora", "full"} <= set(same):
        lo, fu = same["lora"], same["full"]
        notes.append(f"at {full_layers} layers: LoRA step {lo['step_s']:.3f} s vs full {fu['step_s']:.3f} s "
                     f"({fu['step_s'] / lo['step_s']:.2f}x), peak {lo['peak_gib']:.1f} vs {fu['peak_gib']:.1f} GiB")
    full_row = next((r for r in rows if r.get("model") == "full" and "params_b" in r), None)
    if full_row:  # not measured: the KL reference a full fine-tuning run also holds
        ref = full_row["params_b"] * 1e9 * (2 if args.dtype == "bf16" else 4) / GIB
        notes.append(f"with a KL reference, full fine-tuning also holds its frozen copy (+{ref:.1f} GiB at "
                     f"{full_layers} layers, not in its peak above); LoRA's is the actor with its adapters off (+0)")
    built = {(r["model"], r["layers"]): r for r in rows if r.get("build_s")}
    notes += [f"{m} {n} layers: built in {r['build_s']:.1f} s (weights drawn on the {r['init']})"
              for (m, n), r in built.items()]
    notes.append(f"total {time.perf_counter() - start:.0f} s")
    print_table(rows, args, notes)
    write_result(args, rows, notes)
    return rows


if __name__ == "__main__":
    main()
