"""Sequence packing vs padded micro-batches: padding fraction, log-prob and update time, peak memory.

    python -m tools.bench.bench_packing --out /tmp/packing                  # H200: all GPU scenarios
    python -m tools.bench.bench_packing --scenarios tiny --repeats 1         # CPU dry run

Scenarios (random weights of the named shape, bf16 on GPU; padded = the preset's micro_batch_size_per_gpu rows
per micro-batch, each trimmed to its longest row; the update runs per mini-batch of the preset's size):
- `uniform`: Qwen2.5-0.5B dims, prompt lengths uniform in [64, 256], responses uniform in [32, 256], one
  mini-batch of configs/qwen2.5-0.5b_gsm8k_grpo.yaml (64 prompts x 5 = 320 rows, 8 rows per micro-batch).
- `gsm8k_real`: SmolLM2-135M dims, the (prompt, response) lengths of a real rollout batch of the SmolLM2
  GSM8K preset (every row of benchmarks/2026-12-01-packing/gsm8k_rollout_lengths.json, made by
  python -m tools.bench.gsm8k_rollout_lengths
  with the real model and tokenizer: 192 rows = 24 prompts x 8 there; the preset's step is 64 x 8),
  mini-batches of 128 rows, 32 per micro-batch.
- `gsm8k_real_ppo`: the same rows' first 64 in configs/gsm8k_ppo_smollm2.yaml's batches (64 rows, mini-batches
  of 32, 16 rows per micro-batch).
- `gsm8k`: the same shape with lengths drawn from the recorded GPU run's length statistics (clipped normals
  with the mean, std, min and max of benchmarks/2026-12-01-packing/length_stats_metrics.jsonl, the metrics of
  a SmolLM2 GSM8K GRPO run of 2026-11-30), as measured before.
Packed modes: `auto` (actor.max_tokens_per_gpu=0: micro_batch_size_per_gpu x the batch's longest row,
`packing.token_budget`, the preset's default) and fixed budgets (--budgets).
Both passes are the real ones: `forward_collect` with the actor loss (old log-probs) over the whole batch and
`run_schedule` forward + backward over each mini-batch's micro-batches (the update, without the optimizer step,
which does not depend on the layout). The ideal speed-up is padded token slots / real tokens; efficiency is
the measured speed-up over that ideal (target >= 0.9).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig
from rlhf_mcore.data.packing import padding_stats, plan_bins, token_budget
from rlhf_mcore.logs import init_logger
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.packed import choose_packed_kernel
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches
from tools.bench.bench_train_step import PRESETS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "2026-12-01-packing")
METRICS = os.path.join(DATA, "length_stats_metrics.jsonl")
ROLLOUT = os.path.join(DATA, "gsm8k_rollout_lengths.json")


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


def real_lengths(rows: int, rng: random.Random, path: str = ROLLOUT) -> list[tuple[int, int]]:
    """The recorded rollout's rows (all of them when rows is 0 or more than it has)."""
    with open(path) as f:
        recorded = [tuple(r) for r in json.load(f)["rows"]]
    return recorded[:rows] if 0 < rows < len(recorded) else recorded


@dataclass(frozen=True)
class Scenario:
    preset: str  # model dims (bench_train_step.PRESETS)
    draw: Callable  # (rows, rng) -> [(prompt length, response length)]
    micro: int  # padded rows per micro-batch (the preset's micro_batch_size_per_gpu)
    seq: int  # prompt + response maximum
    rows: int  # rows per measured batch
    mini: int  # rows per mini-batch of the update


SCENARIOS = {
    "uniform": Scenario("qwen2.5-0.5b", uniform_lengths, 8, 512, 320, 320),
    "gsm8k_real": Scenario("smollm2-135m", real_lengths, 32, 512, 512, 128),
    "gsm8k_real_ppo": Scenario("smollm2-135m", real_lengths, 16, 512, 64, 32),  # gsm8k_ppo_smollm2's batches
    "gsm8k": Scenario("smollm2-135m", gsm8k_lengths, 32, 512, 512, 128),
    "tiny": Scenario("tiny", lambda rows, rng: uniform_lengths(rows, rng, (4, 16), (2, 16)), 4, 32, 32, 16),
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


def synced_time(fn) -> float:
    """Seconds of one call of `fn`, the device synchronised before and after."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call (use an odd count: of 2 it is their mean)."""
    synced_time(fn)
    return statistics.median([synced_time(fn) for _ in range(repeats)])


def peak_gib(reset: bool = False) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**30
    if reset:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return peak


def profile_passes(passes: dict, path: str) -> None:
    """torch.profiler tables (top ops by self GPU and by self CPU time) of one call of each pass, to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with open(path, "w") as f:
        for name, fn in passes.items():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize() if torch.cuda.is_available() else None
            table = prof.key_averages()
            for key in ("self_device_time_total", "self_cpu_time_total"):
                f.write(f"== {name}, by {key}\n{table.table(sort_by=key, row_limit=14, max_name_column_width=60)}\n")


def measure(state, fn, batch, split: dict, mini: int, pp_group, repeats: int,
            profile_path: str = "") -> tuple[dict, torch.Tensor]:
    """Both passes, each timed from the un-split batch (packing, or trimming, is part of the cost): log-probs
    over the whole batch, the update over each mini-batch of `mini` rows; each pass's peak memory."""
    seq, num = batch["tokens"].size(1), batch["tokens"].size(0)
    minis = [{k: v[i:i + mini] for k, v in batch.items()} for i in range(0, num, mini)]

    def logprobs():
        return forward_collect(state.model, split_micro_batches(batch, **split), fn, ("logp",), seq, pp_group)

    def update():
        zero_grads(state)
        for part in minis:
            run_schedule(state.model, split_micro_batches(part, **split), fn, forward_only=False)

    peak_gib(reset=True)
    logp = logprobs()["logp"]
    row = {"logprob_micro_batches": len(split_micro_batches(batch, **split)),
           "update_micro_batches": sum(len(split_micro_batches(part, **split)) for part in minis),
           "logprob_s": timed(logprobs, repeats), "peak_logprob_gib": peak_gib(reset=True),
           "update_s": timed(update, repeats), "peak_update_gib": peak_gib()}
    row["total_s"] = row["logprob_s"] + row["update_s"]
    row["peak_gib"] = max(row["peak_logprob_gib"], row["peak_update_gib"])
    if profile_path and torch.cuda.is_available():
        profile_passes({"log-prob": logprobs, "update": update}, profile_path)
    return row, logp


def modes_of(totals: list[int], micro: int, budgets: list[int]) -> list[tuple[str, dict, dict]]:
    """(name, split_micro_batches arguments, padding stats over the whole batch) per mode, padded first."""
    modes = [("padded", dict(micro_batch_size=micro), padding_stats(
        totals, [list(range(i, min(i + micro, len(totals)))) for i in range(0, len(totals), micro)]))]
    for budget in budgets:
        tokens = token_budget(totals, micro, budget)
        modes.append((f"packed {budget or 'auto'}", dict(micro_batch_size=micro, max_tokens=budget, pack=True),
                      {**padding_stats(totals, plan_bins(totals, tokens), packed=True), "budget": tokens}))
    return modes


def run_scenario(name: str, args, ctx, done: list[dict]) -> dict:
    sc = SCENARIOS[name]
    cfg = Config(model=ModelConfig(dtype=args.dtype, attention_backend="sdpa", **PRESETS[sc.preset]),
                 parallel=ParallelConfig())
    lengths = sc.draw(args.rows or sc.rows, random.Random(args.seed))
    batch = make_batch(lengths, sc.seq, PRESETS[sc.preset]["vocab_size"], ctx.device, args.seed)
    hf = load_hf_config(cfg.model)
    state = build_train_state(build_model("actor", hf, cfg.model, cfg.parallel, ctx), cfg.actor.optim, cfg.parallel)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=256.0)
    totals = [p + r for p, r in lengths]
    rows, ref = [], None
    for mode, split, stats in modes_of(totals, sc.micro, args.budgets):
        where = os.path.join(args.out, f"profile_{name}_{mode.replace(' ', '_')}.txt") if name in args.profile else ""
        row, logp = measure(state, fn, batch, split, sc.mini, ctx.pgs.pp, args.repeats, where)
        row.update(mode=mode, **stats)
        ref = logp if ref is None else ref
        row["logp_max_abs_diff"] = float(((logp - ref) * batch["response_mask"]).abs().max())
        rows.append(row)
        if args.out:  # after each mode, so a run cut short keeps what it measured
            write_json(args, done + [{"scenario": name, "partial": True, "modes": rows}])
    base = rows[0]
    ideal = base["computed_tokens"] / base["real_tokens"]
    for row in rows:
        row["speedup"] = base["total_s"] / row["total_s"]
        row["ideal_speedup"] = ideal if row is not base else 1.0
        row["efficiency"] = row["speedup"] / row["ideal_speedup"]
    kernel = choose_packed_kernel(torch.empty(1, device=ctx.device, dtype=state.module.config.params_dtype))
    del state
    return {"scenario": name, "preset": sc.preset, "rows_per_batch": len(lengths), "rows_per_mini_batch": sc.mini,
            "padded_rows_per_micro_batch": sc.micro, "real_tokens": base["real_tokens"],
            "mean_length": sum(totals) / len(totals), "longest": max(totals), "packed_attention": kernel,
            "modes": rows}


def print_table(result: dict) -> None:
    print(f"\n{result['scenario']}: {result['preset']}, {result['rows_per_batch']} rows (mini-batches of "
          f"{result['rows_per_mini_batch']}), mean length {result['mean_length']:.0f}, longest {result['longest']}, "
          f"packed attention {result['packed_attention']}")
    print(f"{'mode':<13}{'budget':>7}{'micro':>10}{'pad %':>6}{'logp s':>8}{'update s':>9}{'total s':>8}"
          f"{'peak GiB':>12}{'speedup':>8}{'ideal':>7}{'eff':>6}{'logp diff':>10}")
    for r in result["modes"]:
        micro = f"{r['logprob_micro_batches']}/{r['update_micro_batches']}"
        peak = f"{r['peak_logprob_gib']:.1f}/{r['peak_update_gib']:.1f}"
        print(f"{r['mode']:<13}{r.get('budget', ''):>7}{micro:>10}{100 * r['padding_fraction']:>6.1f}"
              f"{r['logprob_s']:>8.3f}{r['update_s']:>9.3f}{r['total_s']:>8.3f}{peak:>12}{r['speedup']:>7.2f}x"
              f"{r['ideal_speedup']:>6.2f}x{r['efficiency']:>6.2f}{r['logp_max_abs_diff']:>10.1e}")
    print("(micro: log-prob/update micro-batches; peak: log-prob/update pass)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="uniform,gsm8k_real,gsm8k")
    parser.add_argument("--rows", type=int, default=0, help="rows (sequences) per measured batch (0: the scenario's)")
    parser.add_argument("--budgets", default="0,8192",
                        help="packed token budgets (actor.max_tokens_per_gpu; 0 = auto, the default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", default="", help="scenarios whose passes are also profiled (files in --out)")
    parser.add_argument("--dtype", default="bf16" if torch.cuda.is_available() else "fp32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",")]
    init_logger(0)
    ctx = init_distributed(1, 1, seed=1)
    results = []
    for name in args.scenarios.split(","):
        results.append(run_scenario(name, args, ctx, results))
        print_table(results[-1])
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        if args.out:
            write_json(args, results)


def write_json(args, results: list[dict]) -> None:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "packing.json")
    with open(path, "w") as f:
        json.dump({"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                   else "cpu", "torch": torch.__version__, "results": results}, f, indent=2)
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
