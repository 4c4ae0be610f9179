"""Partial rollouts against the synchronous step under a heavy-tailed response length distribution (issue 37),
on the native engine with the actor's own modules (random weights: only the architecture matters for speed).

    python -m tools.bench.bench_partial_tail --preset qwen2.5-0.5b --dtype bf16 --max-len 4096 --out DIR
    python -m tools.bench.bench_partial_tail          # tiny model, CPU dry run (static decoder, eager steps)

Every sample's response length is drawn from a lognormal (median --median tokens, sigma --sigma) capped at
--max-len; a sample ends there as it would at its EOS (random weights never sample one). A step's batch is
--prompts groups of --n samples. Variants, back to back, each for --seconds of rollout after one warm-up step:
- sync: the synchronous step. All samples of the batch start together and decode until the longest ends (the
  static decoder's loop: ended rows leave the batch, smaller batch buckets as rows end, no refill).
- partial: `async_training.partial_rollout` with `staleness_threshold` --lag (`trainer.partial_rollout`): lag + 1
  batches in flight, one continuous call per step through a batch's worth of slots (finished samples' slots
  refilled mid-decode), stopped once --prompts groups are complete; the rest carry over.
- rounds: the same pool in rounds of --round-tokens (`async_training.continuous=false`).
Reported per variant: rollout s/step, trained tokens per rollout second (and the ratio to sync), staleness, and
steps/min with the forward + backward of one trained batch (measured once, warm, on the first variant's last batch)
added to each step: the training phase is the same work in every variant.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
import types
from pathlib import Path

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.responses import Response, assemble_batch
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.trainer.partial_rollout import PartialRollouts
from tools.bench.bench_rollout import PRESETS, make_prompts, sync


@dataclasses.dataclass(frozen=True)
class Prompt:
    prompt_ids: tuple


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--prompts", type=int, default=4, help="groups per step")
    p.add_argument("--n", type=int, default=4, help="samples per group")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=64, help="response budget (rollout.max_response_length)")
    p.add_argument("--median", type=float, default=12.0, help="median response length")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the response length")
    p.add_argument("--lag", type=int, default=1, help="async_training.staleness_threshold")
    p.add_argument("--round-tokens", type=int, default=0, help="rounds variant (0 = a quarter of --max-len)")
    p.add_argument("--seconds", type=float, default=5.0, help="rollout seconds per variant after warm-up")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--variants", default="sync,partial,rounds",
                   help="comma-separated sync | partial | rounds, each with :LAG to override --lag (partial:4) and "
                        "partial with :LAG:SLOTS for async_training.max_num_seqs (partial:1:512)")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


class TailEngine:
    """The native engine with each sample's length drawn up front: a fresh row (a prompt) draws its sample's
    target; a continuation, keyed by its tokens, keeps it. A sample that reaches its target ends with "stop"."""

    continuous = True

    def __init__(self, engine: NativeRolloutEngine, draw_length, prompts: set):
        self.inner, self.draw_length, self.prompts = engine, draw_length, prompts
        self.engine = self  # what PartialRollouts calls (`rollout.engine`)
        self.targets: dict = {}  # tuple(prefix) -> (response target, prompt length)

    def _target(self, row: list[int]) -> tuple[int, int]:
        key = tuple(row)
        if key in self.prompts:
            return self.draw_length(), len(row)
        return self.targets.pop(key)

    def generate_continuous(self, rows, limits, params, on_finish, num_slots, feed=None):
        meta = [self._target(r) for r in rows]
        lims = [min(lim, total - (len(r) - plen)) for r, lim, (total, plen) in zip(rows, limits, meta)]

        def finished(i, response):
            total, plen = meta[i]
            reached = len(rows[i]) - plen + len(response.tokens) >= total
            if not reached:  # ended at the caller's limit (a round): it continues later
                self.targets[tuple(rows[i] + response.tokens)] = meta[i]
            return on_finish(i, Response(response.tokens, response.logprobs,
                                         "stop" if reached else response.finish_reason))
        cut = self.inner.generate_continuous(rows, lims, params, finished, num_slots, feed=feed)
        for i, response in cut.items():
            self.targets[tuple(rows[i] + response.tokens)] = meta[i]
        return cut

    def generate(self, rows, params, show_progress=False):
        """A round (or the synchronous step): every row in a slot at once, to its target or max_new_tokens."""
        prompts = [list(r) for r in rows]
        ended: dict = {}

        def keep(i, response):
            ended[i] = response
            return False
        cut = self.generate_continuous(prompts, [params.max_new_tokens] * len(prompts), params, keep, len(prompts))
        assert not cut
        return assemble_batch(prompts, [ended[i] for i in range(len(prompts))], 0, self.inner.ctx.device)


def train_seconds(model, batch, ctx, tokens_per_micro: int = 16384) -> float:
    """Forward + backward of the token log-probs of `batch`, rows sorted by length into padded micro-batches."""
    from rlhf_mcore.models.logprobs import token_logprobs

    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sync(ctx.device)
    start = time.perf_counter()
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and (j - i + 1) * lengths[order[j]] <= max(tokens_per_micro, lengths[order[j]]):
            j += 1
        idx = torch.tensor(order[i:max(j, i + 1)], device=batch.tokens.device)
        width = max(lengths[k] for k in idx.tolist())
        tokens = batch.tokens[idx, :width]
        positions = torch.arange(width, device=tokens.device).expand_as(tokens)
        logp, _ = token_logprobs(model, model(tokens, positions, None), tokens, ctx.pgs.tp)
        logp.float().sum().backward()
        i = max(j, i + 1)
    sync(ctx.device)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run_variant(spec, args, engine, model, ctx, vocab) -> dict:
    device = ctx.device
    kind, lag, slots = (spec.split(":") + ["", ""])[:3]
    lag, slots = int(lag or args.lag), int(slots or 0)
    name = kind if kind == "sync" else f"{kind}_lag{lag}" + (f"_{slots}" if slots else "")
    g = torch.Generator().manual_seed(7)
    mu = math.log(args.median)

    def draw_length() -> int:
        return max(1, min(args.max_len, int(math.exp(mu + args.sigma * float(torch.randn((), generator=g))))))
    prompt_seed = iter(range(10**6))
    prompts_seen: set = set()

    def draw():
        rows = make_prompts(args.prompts, args.prompt_len, vocab, ragged=True, seed=next(prompt_seed) + 1000)
        prompts_seen.update(tuple(r) for r in rows)
        return [Prompt(tuple(r)) for r in rows]
    tail = TailEngine(engine, draw_length, prompts_seen)
    params = SamplingParams(n=args.n, max_new_tokens=args.max_len, temperature=1.0, seed=3)
    cfg = types.SimpleNamespace(
        rollout=types.SimpleNamespace(n=args.n, max_response_length=args.max_len),
        async_training=types.SimpleNamespace(partial_rollout=True, staleness_threshold=lag,
                                             round_tokens=args.round_tokens, continuous=kind == "partial",
                                             max_num_seqs=slots))
    partial = None if kind == "sync" else PartialRollouts(cfg, 0, device, engine=tail)

    def step(version: int):
        if partial is None:
            prompts = draw()
            return tail.generate([list(p.prompt_ids) for p in prompts for _ in range(args.n)], params), {}
        _, batch, report = partial.generate(tail, draw, params, version)
        return batch, {k: v[0] for k, v in report.items()}
    steps, rollout_s, tokens, staleness, carried, last = 0, 0.0, 0, [], [], None
    for version in range(args.max_steps + 1):
        sync(device)
        start = time.perf_counter()
        batch, report = step(version)
        sync(device)
        elapsed = time.perf_counter() - start
        if version == 0:  # warm-up: graphs, compiles, the first fill of the pool
            continue
        steps, rollout_s, last = steps + 1, rollout_s + elapsed, batch
        tokens += int(batch.response_lengths.sum())
        staleness.append(report.get("async/staleness_mean", 0.0))
        carried.append(report.get("async/samples_carried_total", 0.0))
        print(f"  {name} step {version}: {elapsed:.2f} s, {int(batch.response_lengths.sum())} tokens, "
              f"max len {int(batch.response_lengths.max())}, staleness {staleness[-1]:.2f}", flush=True)
        if rollout_s >= args.seconds:
            break
    return {"variant": name, "lag": 0 if kind == "sync" else lag, "steps": steps,
            "rollout_s_per_step": rollout_s / steps, "trained_tokens_per_step": tokens / steps,
            "rollout_tok_s": tokens / rollout_s,
            "staleness_mean": sum(staleness) / steps, "carried_mean": sum(carried) / steps}, last


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = Config(model=ModelConfig(dtype=args.dtype, **PRESETS[args.preset]), parallel=ParallelConfig())
    ctx = init_distributed(1, 1, seed=1234)
    hf = load_hf_config(cfg.model)
    model = build_model("actor", hf, cfg.model, cfg.parallel, ctx)
    engine = NativeRolloutEngine(model, ctx, pad_id=0, static_on_cpu=True)
    device = ctx.device
    runs = [run_variant(v, args, engine, model, ctx, hf["vocab_size"]) for v in args.variants.split(",")]
    results = [r for r, _ in runs]
    train_seconds(model, runs[0][1], ctx)  # warm-up (allocator, kernels)
    train_s = train_seconds(model, runs[0][1], ctx)  # the first variant's last batch: the same for every variant
    for r in results:
        r["train_fwd_bwd_s"] = train_s
        r["steps_per_min"] = 60.0 / (r["rollout_s_per_step"] + train_s)
    base = next((r for r in results if r["variant"] == "sync"), results[0])
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu x{torch.get_num_threads()}"
    print(f"heavy tail: {args.preset} {args.dtype} on {name}; {args.prompts} groups x {args.n}, lengths lognormal "
          f"(median {args.median}, sigma {args.sigma}) capped at {args.max_len}")
    print(f"{'variant':>12} {'steps':>5} {'rollout s/step':>14} {'tok/step':>8} {'tok/s':>9} {'vs sync':>7} "
          f"{'staleness':>9} {'fwd+bwd s':>9} {'steps/min':>9} {'vs sync':>7}")
    for r in results:
        r["rollout_tok_s_vs_sync"] = r["rollout_tok_s"] / base["rollout_tok_s"]
        r["steps_per_min_vs_sync"] = r["steps_per_min"] / base["steps_per_min"]
        print(f"{r['variant']:>12} {r['steps']:>5} {r['rollout_s_per_step']:>14.2f} "
              f"{r['trained_tokens_per_step']:>8.0f} {r['rollout_tok_s']:>9.0f} "
              f"{r['rollout_tok_s_vs_sync']:>6.2f}x {r['staleness_mean']:>9.2f} {r['train_fwd_bwd_s']:>9.2f} "
              f"{r['steps_per_min']:>9.2f} {r['steps_per_min_vs_sync']:>6.2f}x")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"partial_tail_{args.preset}.json").write_text(json.dumps(
            {"args": vars(args), "device": name, "decode_attention": getattr(engine.static, "attention_name", None),
             "results": results}, indent=2))


if __name__ == "__main__":
    main()
