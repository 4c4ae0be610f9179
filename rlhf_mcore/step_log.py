"""Per-step metrics with verl's names, and the fixed-format console line printed once per step."""
from __future__ import annotations

import torch

from rlhf_mcore.phases import gather_dp

# (label, metric key, format) of the console line, in order; missing metrics print as "-".
LINE_FIELDS = (
    ("reward", "critic/score/mean", "{:.3f}"), ("±", "critic/score/std", "{:.3f}"),
    ("acc", "critic/acc/mean", "{:.3f}"), ("pg", "actor/pg_loss", "{:+.4f}"), ("vf", "critic/vf_loss", "{:.4f}"),
    ("kl", "actor/kl", "{:.4f}"), ("ent", "actor/entropy", "{:.3f}"), ("clip", "actor/pg_clipfrac", "{:.3f}"),
    ("gnorm", "actor/grad_norm", "{:.3f}"), ("len", "response_length/mean", "{:.1f}"),
    ("max", "response_length/max", "{:.0f}"), ("tok/s", "perf/throughput", "{:.0f}"),
    ("mem", "perf/max_memory_gb", "{:.2f}GB"),
)
PHASES = ("gen", "reward", "old_log_prob", "adv", "update_critic", "update_actor", "sync_weights")


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/std": values.std(unbiased=False).item(),
            f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def _masked(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    picked = values[mask.bool()]
    return _stats(prefix, picked) if picked.numel() else {}


def peak_memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def step_metrics(batch: dict, loss_metrics: dict, extra: dict, timings: dict, ctx) -> dict[str, float]:
    """Everything logged for one step, reduced over DP (batch statistics are over the global batch)."""
    g = {k: gather_dp(batch[k], ctx) for k in ("token_level_scores", "token_level_rewards", "response_mask",
                                                "response_lengths", "prompt_lengths", "advantages", "returns")}
    mask = g["response_mask"]
    metrics = {**_stats("critic/score", g["token_level_scores"].sum(-1)),
               **_stats("critic/rewards", g["token_level_rewards"].sum(-1)),
               **_masked("critic/advantages", g["advantages"], mask), **_masked("critic/returns", g["returns"], mask),
               **_stats("response_length", g["response_lengths"]), **_stats("prompt_length", g["prompt_lengths"])}
    if "values" in batch:
        metrics.update(_masked("critic/values", gather_dp(batch["values"], ctx), mask))
    metrics.update({k: float(v) for k, v in extra.items()})
    metrics.update(loss_metrics)
    kl = metrics.get("actor/kl_loss", metrics.get("actor/reward_kl"))
    if kl is not None:
        metrics["actor/kl"] = kl
    total_tokens = float((g["response_lengths"] + g["prompt_lengths"]).sum())
    step_time = sum(timings.values())
    metrics.update({f"timing_s/{k}": v for k, v in timings.items()})
    metrics["perf/total_num_tokens"] = total_tokens
    metrics["perf/throughput"] = total_tokens / max(step_time, 1e-9) / ctx.dims.world_size
    metrics["perf/max_memory_gb"] = peak_memory_gb()
    return metrics


def format_step_line(step: int, total: int, m: dict) -> str:
    """One fixed-format line: the same fields in the same order every step."""
    parts = [f"step {step}/{total}"]
    for label, key, fmt in LINE_FIELDS:
        parts.append(f"{label} {fmt.format(m[key]) if key in m else '-'}")
    phases = " ".join(f"{p} {m[f'timing_s/{p}']:.1f}s" for p in PHASES if f"timing_s/{p}" in m)
    return " | ".join([parts[0], " ".join(parts[1:4]), " ".join(parts[4:10]), " ".join(parts[10:]), phases])
