"""Sequence packing vs padded micro-batches: padding fraction, log-prob and update time, peak memory.

    python -m tools.bench.bench_packing --out tools/bench/results            # H200: both scenarios
    python -m tools.bench.bench_packing --scenarios tiny --rows 16           # CPU dry run

Scenarios (random weights of the named shape, bf16 on GPU):
- `uniform`: Qwen2.5-0.5B dims, prompt lengths uniform in [64, 256], responses uniform in [32, 256];
  padded = the GRPO preset's micro_batch_size_per_gpu (8 rows, each micro-batch trimmed to its longest).
- `gsm8k`: SmolLM2-135M dims, lengths drawn from the prompt/response length statistics (mean, std, min,
  max) of the SmolLM2 GSM8K GRPO run in results/gpu_grpo_smollm2_gsm8k_metrics.jsonl (a clipped normal,
  not the rollout's own rows); padded = that preset's 16 rows per micro-batch.
Both passes are the real ones: `forward_collect` with the actor loss (old log-probs) and one
`run_schedule` forward + backward over all micro-batches (the update, without the optimizer step, which
does not depend on the layout). The ideal speed-up is padded token slots / real tokens; efficiency is the
measured speed-up over that ideal (target >= 0.9).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from functools import partial

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig
from rlhf_mcore.data.packing import padding_stats, plan_bins
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.packed import choose_packed_kernel
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches
from tools.bench.bench_train_step import PRESETS

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = os.path.join(HERE, "results", "gpu_grpo_smollm2_gsm8k_metrics.jsonl")


def uniform_lengths(rows: int, rng: random.Random, prompt=(64, 256), response=(32, 256)) -> list[tuple[int, int]]:
    return [(rng.randint(*prompt), rng.randint(*response)) for _ in range(rows)]


def gsm8k_lengths(rows: int, rng: random.Random, path: str = METRICS) -> list[tuple[int, int]]:
    """Clipped normals with the run's mean over steps of each length statistic."""
    with open(path) as f:
        steps = [s for s in map(json.loads, f) if "response_length/mean" in s]
    stat = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0] if k.split("/")[0] in
            ("prompt_length", "response_length")}

    def draw(name):
        x = rng.gauss(stat[f"{name}/mean"], stat[f"{name}/std"])
        return int(min(max(round(x), stat[f"{name}/min"]), stat[f"{name}/max"]))

    return [(draw("prompt_length"), draw("response_length")) for _ in range(rows)]


SCENARIOS = {  # name: (model preset, lengths, padded rows per micro-batch, prompt + response maximum)
    "uniform": ("qwen2.5-0.5b", uniform_lengths, 8, 512),
    "gsm8k": ("smollm2-135m", gsm8k_lengths, 16, 512),
    "tiny": ("tiny", lambda rows, rng: uniform_lengths(rows, rng, (4, 16), (2, 16)), 4, 32),
}


def make_batch(lengths: list[tuple[int, int]], seq: int, vocab: int, device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    num = len(lengths)
    prompt = torch.tensor([p for p, _ in lengths])
    total = prompt + torch.tensor([r for _, r in lengths])
    pos = torch.arange(seq).unsqueeze(0)
    valid = pos < total.unsqueeze(1)
    batch = {"tokens": torch.randint(1, vocab, (num, seq), generator=g) * valid, "lengths": total,
             "response_mask": (valid & (pos >= prompt.unsqueeze(1))).float(),
             "old_logp": -torch.rand(num, seq, generator=g) * 5, "advantages": torch.randn(num, seq, generator=g)}
    return {k: v.to(device) for k, v in batch.items()}


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    times = []
    for i in range(repeats + 1):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(state, fn, batch, split: dict, pp_group, repeats: int) -> tuple[dict, torch.Tensor]:
    """Both passes, each timed from the un-split batch (packing, or trimming, is part of the cost)."""
    seq = batch["tokens"].size(1)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def logprobs():
        return forward_collect(state.model, split_micro_batches(batch, **split), fn, ("logp",), seq, pp_group)

    def update():
        zero_grads(state)
        run_schedule(state.model, split_micro_batches(batch, **split), fn, forward_only=False)

    logp = logprobs()["logp"]
    row = {"num_micro_batches": len(split_micro_batches(batch, **split)), "logprob_s": timed(logprobs, repeats),
           "update_s": timed(update, repeats)}
    row["total_s"] = row["logprob_s"] + row["update_s"]
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    return row, logp


def run_scenario(name: str, args, ctx) -> dict:
    preset, draw, micro, seq = SCENARIOS[name]
    cfg = Config(model=ModelConfig(dtype=args.dtype, attention_backend="sdpa", **PRESETS[preset]),
                 parallel=ParallelConfig())
    lengths = draw(args.rows, random.Random(args.seed))
    batch = make_batch(lengths, seq, PRESETS[preset]["vocab_size"], ctx.device, args.seed)
    hf = load_hf_config(cfg.model)
    state = build_train_state(build_model("actor", hf, cfg.model, cfg.parallel, ctx), cfg.actor.optim, cfg.parallel)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=256.0)
    totals = [p + r for p, r in lengths]
    modes = [("padded", dict(micro_batch_size=micro), padding_stats(
        totals, [list(range(i, min(i + micro, len(totals)))) for i in range(0, len(totals), micro)]))]
    for budget in args.budgets:
        modes.append((f"packed {budget}", dict(max_tokens=budget, pack=True),
                      padding_stats(totals, plan_bins(totals, budget), packed=True)))
    rows, ref = [], None
    for mode, split, stats in modes:
        row, logp = measure(state, fn, batch, split, ctx.pgs.pp, args.repeats)
        row.update(mode=mode, **stats)
        if ref is None:
            ref = logp
        row["logp_max_abs_diff"] = float(((logp - ref) * batch["response_mask"]).abs().max())
        rows.append(row)
    base = rows[0]
    ideal = base["computed_tokens"] / base["real_tokens"]
    for row in rows:
        row["speedup"] = base["total_s"] / row["total_s"]
        row["ideal_speedup"] = ideal if row is not base else 1.0
        row["efficiency"] = row["speedup"] / row["ideal_speedup"]
    kernel = choose_packed_kernel(torch.empty(1, device=ctx.device, dtype=state.module.config.params_dtype))
    del state
    return {"scenario": name, "preset": preset, "rows_per_batch": args.rows, "real_tokens": base["real_tokens"],
            "mean_length": sum(totals) / len(totals), "packed_attention": kernel, "modes": rows}


def print_table(result: dict) -> None:
    print(f"\n{result['scenario']}: {result['preset']}, {result['rows_per_batch']} rows, mean length "
          f"{result['mean_length']:.0f}, packed attention {result['packed_attention']}")
    print(f"{'mode':<14}{'micro':>6}{'pad %':>7}{'logp s':>9}{'update s':>10}{'total s':>9}{'peak GiB':>10}"
          f"{'speedup':>9}{'ideal':>7}{'eff':>6}{'logp diff':>11}")
    for r in result["modes"]:
        print(f"{r['mode']:<14}{r['num_micro_batches']:>6}{100 * r['padding_fraction']:>7.1f}{r['logprob_s']:>9.3f}"
              f"{r['update_s']:>10.3f}{r['total_s']:>9.3f}{r['peak_gib']:>10.1f}{r['speedup']:>8.2f}x"
              f"{r['ideal_speedup']:>6.2f}x{r['efficiency']:>6.2f}{r['logp_max_abs_diff']:>11.2e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="uniform,gsm8k")
    parser.add_argument("--rows", type=int, default=256, help="rows (sequences) per measured batch")
    parser.add_argument("--budgets", default="8192,16384", help="packed token budgets (max_tokens_per_gpu)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="bf16" if torch.cuda.is_available() else "fp32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",")]
    init_logger(0)
    ctx = init_distributed(1, 1, seed=1)
    results = []
    for name in args.scenarios.split(","):
        results.append(run_scenario(name, args, ctx))
        print_table(results[-1])
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "packing.json")
        with open(path, "w") as f:
            json.dump({"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "torch": torch.__version__, "results": results}, f, indent=2)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
