"""MoE and dense GRPO-like train steps on one GPU (issue 24): a Qwen3-30B-A3B-shaped MoE cut to fit, with
megatron's SequentialMLP experts and ours (models/experts_grouped.py, torch._grouped_mm), and the Qwen3-0.6B
dense shape against Qwen2.5-0.5B's on the same tokens; plus the largest MoE that fits for training.

    python -m tools.bench.bench_moe_step --out results/     # one H200, ~5 min (random weights, bf16)
    python -m tools.bench.bench_moe_step --tiny --out /tmp  # CPU smoke test (fp32, tiny shapes), seconds

Per model, the two phases of a GRPO step the trainer runs on it: `log_prob` (a forward-only pass for the old
log-probs, as `old_log_prob`) and `update` (megatron's schedule over the micro-batches, forward + backward
of the PPO loss on fused log-probs, gradient finalisation and the distributed optimizer's step: bf16 weights,
fp32 main grads and master weights). Median of --steps timed steps after --warmup. MFU = model FLOPs of the
active parameters (models/flops.py: the top-k experts, not all) / time / --peak-tflops (790: the H200's
measured bf16 dense matmul rate). Both expert implementations run on ONE model (GroupedExperts switched to
SequentialMLP's loop and back: same weights), so their log-probs are compared too (`logp_max_diff`).

The MoE shape: hidden 2048, 128 experts top-8 (norm_topk_prob), moe_intermediate 768, 32 heads / 4 KV heads,
head_dim 128, vocab 151936, untied head; Qwen3-30B-A3B has 48 such layers, one H200 trains --moe-layers of
them (0: the most whose estimate fits 95% of the memory, tools/bench/moe_memory.py). --find-largest also
times a 2-layer model and fits peak memory = a + b x layers through the two measured peaks.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from functools import partial

import torch

from rlhf_mcore.config import ActorConfig, ModelConfig, OptimConfig, ParallelConfig
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model, count_parameters
from rlhf_mcore.models.experts_grouped import GroupedExperts
from rlhf_mcore.models.flops import forward_flops_per_token, mlp_params_per_token
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.schedule import run_schedule, split_micro_batches
from tools.bench.bench_train_step import make_batch
from tools.bench.moe_memory import GIB, fit_largest, largest_layers, layer_params, outside_params

_ROPE = dict(rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096, hidden_act="silu")
MOE = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048, intermediate_size=6144,
           moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
           num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
           tie_word_embeddings=False, **_ROPE)
DENSE = {
    "qwen3-0.6b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], num_hidden_layers=28,
                       hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, vocab_size=151936, tie_word_embeddings=True, **_ROPE),
    "qwen2.5-0.5b": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_hidden_layers=24,
                         hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True, **_ROPE),
}
TINY = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300, num_hidden_layers=2)
IMPLS = ("sequential", "grouped")


def shapes(tiny: bool, moe_layers: int) -> tuple[dict, dict[str, dict]]:
    """(MoE HF config, dense HF configs by name); tiny: the same families at test size."""
    if not tiny:
        return {**MOE, "num_hidden_layers": moe_layers}, DENSE
    moe = {**MOE, **TINY, "num_hidden_layers": moe_layers or 2}
    dense = {name: {**cfg, **{k: v for k, v in TINY.items() if "expert" not in k and k != "head_dim"},
                    "head_dim": 16 if cfg["model_type"] == "qwen3" else None} for name, cfg in DENSE.items()}
    return moe, {k: {f: v for f, v in cfg.items() if v is not None} for k, cfg in dense.items()}


def set_expert_kernel(model, kernel: str) -> int:
    """Switch every GroupedExperts of `model` to `kernel` ('sequential' | 'grouped_mm'); returns how many."""
    experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
    for m in experts:
        m.kernel = kernel
    return len(experts)


def update_fn(state, mbs, loss_fn, lr: float, peaks: dict):
    """One update (forward + backward over `mbs`, optimizer step) as a function returning the loss sum; it keeps
    the peaks of forward + backward and of the optimizer step apart in `peaks` (GiB, max over calls)."""
    def update() -> float:
        peak_gib(reset=True)
        zero_grads(state)
        outputs = run_schedule(state.model, mbs, loss_fn, forward_only=False)
        peaks["fwd_bwd"] = max(peaks.get("fwd_bwd", 0.0), peak_gib(reset=True))
        optimizer_step(state, lr)
        peaks["optimizer"] = max(peaks.get("optimizer", 0.0), peak_gib(reset=True))
        return float(sum(o["actor/loss_sum"] for o in outputs))

    return update


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def peak_gib(reset: bool = False) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    value = torch.cuda.max_memory_allocated() / GIB
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return value


def phase_row(hf: dict, name: str, seconds: float, tokens: int, seq: int, passes: int, peak: float, args) -> dict:
    flops = forward_flops_per_token(hf, seq) * tokens * passes
    return {"phase": name, "step_s": seconds, "tokens_per_s": tokens / seconds, "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / (args.peak_tflops * 1e12), "peak_gib": peak}


def time_phase(fn, warmup: int, steps: int):
    """(median seconds of the timed calls, the last call's result)."""
    times, result = [], None
    for i in range(warmup + steps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], result


def active_params(hf: dict) -> int:
    """Parameters one token multiplies by (MoE: the top-k experts and the router), with the output layer."""
    attention_and_norms = layer_params({**hf, "num_experts": 0}) - 3 * hf["hidden_size"] * hf["intermediate_size"]
    per_layer = attention_and_norms + mlp_params_per_token(hf)
    return hf["num_hidden_layers"] * per_layer + hf["vocab_size"] * hf["hidden_size"]


def impl_name(kernel: str, hf: dict) -> str:
    return {"sequential": "sequential", "grouped_mm": "grouped"}[kernel] if hf.get("num_experts") else "dense"


def bench_model(label: str, hf: dict, ctx, args, batch: dict) -> list[dict]:
    """One model (MoE: GroupedExperts, switched between both kernels on the same weights): per kernel the
    log-prob forward first (no weight changes, so the kernels' log-probs compare), then the update steps."""
    kernels = ("sequential", "grouped_mm") if hf.get("num_experts") else ("grouped_mm",)
    model_cfg = ModelConfig(dtype=args.dtype, attention_backend="auto", moe_expert_impl="grouped",
                            lora_rank=args.lora_rank, lora_alpha=2.0 * args.lora_rank)  # LoRA: experts' too
    actor_cfg = ActorConfig(optim=OptimConfig(lr=1e-6))
    parallel = ParallelConfig(use_distributed_optimizer=True)
    free_memory()
    start = time.perf_counter()
    model, drawn = build_fast("actor", hf, model_cfg, parallel, ctx)
    num_params = count_parameters(model)
    state = build_train_state(model, actor_cfg.optim, parallel)
    common = {"model": label, "layers": hf["num_hidden_layers"], "params_b": num_params / 1e9,
              "lora_rank": args.lora_rank, "trainable_b": sum(p.numel() for p in model.parameters()
                                                              if p.requires_grad) / 1e9,
              "active_params_b": active_params(hf) / 1e9, "build_s": time.perf_counter() - start, "init": drawn}
    loss_fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=actor_cfg, temperature=1.0,
                      norm_length=float(batch["tokens"].size(1)))
    mbs = split_micro_batches(batch, args.micro_batch)
    tokens, seq = batch["tokens"].numel(), batch["tokens"].size(1)

    def log_prob():
        with torch.no_grad():
            outputs = run_schedule(state.model, mbs, partial(loss_fn, non_loss_data=True), forward_only=True)
        return torch.cat([o["logp"].float().flatten() for o in outputs])

    peaks = {}
    update = update_fn(state, mbs, loss_fn, actor_cfg.optim.lr, peaks)

    rows, logps = [], {}
    for kernel in kernels:  # forward-only first, while every kernel sees the same weights
        set_expert_kernel(model, kernel)
        peak_gib(reset=True)  # not the build's
        seconds, logps[kernel] = time_phase(log_prob, args.warmup, args.steps)
        rows.append({**common, "impl": impl_name(kernel, hf),
                     **phase_row(hf, "log_prob", seconds, tokens, seq, 1, peak_gib(reset=True), args)})
    diff = (logps[kernels[0]] - logps[kernels[-1]]).abs().max().item()
    for kernel in kernels:
        set_expert_kernel(model, kernel)
        peaks.clear()
        seconds, loss = time_phase(update, args.warmup, args.steps)
        if not torch.cuda.is_available():
            peaks.update(fwd_bwd=float("nan"), optimizer=float("nan"))
        rows.append({**common, "impl": impl_name(kernel, hf), "loss": loss, "peak_fwd_bwd_gib": peaks["fwd_bwd"],
                     "peak_optimizer_gib": peaks["optimizer"],
                     **phase_row(hf, "update", seconds, tokens, seq, 3, max(peaks.values()), args)})
    for r in rows:
        r["logp_max_diff_vs_sequential"] = diff if len(kernels) == 2 else None
    return rows  # the model and its optimizer go with this frame (safe_bench frees the memory)


def build_fast(role: str, hf: dict, model_cfg, parallel, ctx):
    """(model, where its random weights were drawn): on the GPU where there is one (bench_lora_step's
    gpu_initialization: seconds instead of a minute of CPU draws for billions of parameters), else the CPU."""
    if torch.cuda.is_available():
        from tools.bench.bench_lora_step import gpu_initialization

        try:
            with gpu_initialization():
                return build_model(role, hf, model_cfg, parallel, ctx), "gpu"
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # the trainer's CPU initialisation always works
            print(f"GPU initialisation failed ({type(e).__name__}: {e}); drawing the weights on the CPU")
            free_memory()
    return build_model(role, hf, model_cfg, parallel, ctx), "cpu"


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def safe_bench(label: str, hf: dict, ctx, args, batch: dict) -> list[dict]:
    try:
        rows = bench_model(label, hf, ctx, args, batch)
    except torch.OutOfMemoryError as e:
        rows = [{"model": label, "layers": hf["num_hidden_layers"], "error": f"OOM: {str(e)[:160]}"}]
    free_memory()
    return rows


def capacity_bytes(args) -> float:
    if args.capacity_gib:
        return args.capacity_gib * GIB
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return 139 * GIB  # an H200 as torch reports it


def largest_statement(moe: dict, rows: list[dict], args, tokens_per_micro: int) -> dict:
    """The largest MoE (layers of this shape) that trains on one device: the estimate, and where two layer
    counts were measured the line through their peaks (3 GiB kept free: CUDA context, fragmentation)."""
    capacity = capacity_bytes(args)
    out = {"capacity_gib": capacity / GIB, "tokens_per_micro_batch": tokens_per_micro,
           "estimate_layers": largest_layers(moe, tokens_per_micro, capacity - 3 * GIB)}
    measured = [r for r in rows if r.get("model") == "moe" and r.get("phase") == "update"
                and r.get("impl") == "grouped" and r["peak_gib"] == r["peak_gib"]]  # nan: no GPU
    if len({r["layers"] for r in measured}) >= 2:
        for part in ("fwd_bwd", "optimizer"):  # a line through each peak; the lower answer holds
            points = [(r["layers"], r[f"peak_{part}_gib"] * GIB) for r in measured]
            layers, intercept, slope = fit_largest(points, capacity - 3 * GIB)
            out[f"fit_{part}"] = {"layers": layers, "intercept_gib": intercept / GIB, "gib_per_layer": slope / GIB}
        out["measured_layers"] = min(out["fit_fwd_bwd"]["layers"], out["fit_optimizer"]["layers"])
    best = out.get("measured_layers", out["estimate_layers"])
    hf = {**moe, "num_hidden_layers": best}
    out.update(layers=best, params_b=(outside_params(hf) + best * layer_params(hf)) / 1e9,
               active_params_b=active_params(hf) / 1e9)
    return out


def print_table(rows: list[dict], largest: dict, args) -> None:
    lora = f"LoRA rank {args.lora_rank} on every linear (experts too)" if args.lora_rank else "full fine-tuning"
    print(f"{args.dtype}, {args.sequences} x {args.seq_len} tokens per step, micro-batch {args.micro_batch}, "
          f"distributed optimizer, {lora}; MFU of active-parameter FLOPs vs {args.peak_tflops:.0f} TFLOP/s")
    print(f"{'model':<14}{'layers':>7}{'params B':>9}{'active B':>9}{'impl':>12}{'phase':>10}{'step s':>9}"
          f"{'tokens/s':>11}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<14}{r['layers']:>7}  {r['error']}")
            continue
        print(f"{r['model']:<14}{r['layers']:>7}{r['params_b']:>9.3f}{r['active_params_b']:>9.3f}{r['impl']:>12}"
              f"{r['phase']:>10}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}{r['tflops']:>9.1f}{r['mfu']:>7.1%}"
              f"{r['peak_gib']:>10.1f}")
    moe = [r for r in rows if r.get("model") == "moe" and "logp_max_diff_vs_sequential" in r]
    if moe:
        diff = moe[0]["logp_max_diff_vs_sequential"]
        print(f"grouped vs sequential log-probs (same weights): max |diff| = {diff:.3g}")
    fit = " (estimate only)"
    if "measured_layers" in largest:
        lines = [f"{part} {f['intercept_gib']:.1f} + {f['gib_per_layer']:.2f} GiB/layer"
                 for part, f in ((p, largest[f"fit_{p}"]) for p in ("fwd_bwd", "optimizer"))]
        fit = f" (measured peaks: {'; '.join(lines)})"
    print(f"largest MoE of this shape that trains in {largest['capacity_gib']:.0f} GiB: {largest['layers']} layers, "
          f"{largest['params_b']:.2f} B params ({largest['active_params_b']:.2f} B active){fit}; "
          f"estimate alone: {largest['estimate_layers']} layers")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny fp32 shapes, 4 x 32 tokens (CPU smoke test)")
    p.add_argument("--moe-layers", type=int, default=0, help="layers of the MoE (0: the most that fit, estimated)")
    p.add_argument("--moe", type=int, default=1, help="1: the MoE (0: only the dense pair)")
    p.add_argument("--find-largest", type=int, default=1, help="1: also time a 2-layer MoE and fit the peaks")
    p.add_argument("--dense", type=int, default=1, help="1: also the dense pair (Qwen3-0.6B vs Qwen2.5-0.5B)")
    p.add_argument("--sequences", type=int, default=16, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA rank on every linear, experts included (0: full)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--capacity-gib", type=float, default=0, help="device memory for the largest-fit statement")
    p.add_argument("--out", default="", help="directory for moe_step.json")
    args = p.parse_args(argv)
    args.dtype = "fp32" if args.tiny else "bf16"
    if args.tiny:
        args.sequences, args.seq_len, args.micro_batch, args.steps, args.warmup = 4, 32, 2, 1, 0
    return args


def result_name(args) -> str:
    """moe_step[_lora<r>][_tiny].json"""
    return f"moe_step{f'_lora{args.lora_rank}' if args.lora_rank else ''}{'_tiny' if args.tiny else ''}.json"


def write_result(args, rows: list[dict], largest: dict | None) -> dict:
    """The result so far (written after every model, so a run cut short by a time limit keeps its rows)."""
    result = {"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "rows": rows, "largest_moe": largest}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, result_name(args))
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    init_logger()
    ctx = init_distributed(1, 1, seed=1)
    tokens_per_micro = args.micro_batch * args.seq_len
    moe_full = {**MOE, "num_hidden_layers": 0}
    layers = args.moe_layers or (2 if args.tiny else largest_layers(moe_full, tokens_per_micro,
                                                                    0.95 * capacity_bytes(args)))
    moe, dense = shapes(args.tiny, layers)
    batch = make_batch(args.sequences, args.seq_len, moe["vocab_size"], ctx.device)
    todo = [("moe", moe)] if args.moe else []
    if args.moe and args.find_largest:  # the small one first: a run cut short by a time limit still has MoE rows
        todo.insert(0, ("moe", {**moe, "num_hidden_layers": 1 if args.tiny else 2}))
    todo += list(dense.items()) if args.dense else []
    rows = []
    for label, hf in todo:
        rows += safe_bench(label, hf, ctx, args, batch)
        write_result(args, rows, None)
    largest = largest_statement(moe_full, [] if args.tiny else rows, args, tokens_per_micro)  # the real shape
    print_table(rows, largest, args)
    result = write_result(args, rows, largest)
    if args.out:
        print(f"wrote {os.path.join(args.out, result_name(args))}")
    return result


if __name__ == "__main__":
    main()
