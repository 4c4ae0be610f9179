"""Per-step metrics with verl's names, and the fixed-format console line printed once per step."""
from __future__ import annotations

import torch

from rlhf_mcore.algorithms.stats import masked_var
from rlhf_mcore.logs import RUN_PEAK, take_device_used, take_phase_peaks
from rlhf_mcore.trainer.phases import gather_dp

# (label, metric key, format) of the console line, in order; missing metrics print as "-", except the
# OPTIONAL ones (accuracy and format rate: only a reward that reports them has them), left out.
LINE_FIELDS = (
    ("reward", "critic/score/mean", "{:.3f}"), ("±", "critic/score/std", "{:.3f}"),
    ("acc", "critic/acc/mean", "{:.3f}"), ("fmt", "critic/format/mean", "{:.3f}"),
    ("pg", "actor/pg_loss", "{:+.4f}"), ("vf", "critic/vf_loss", "{:.4f}"),
    ("kl", "actor/kl", "{:.4f}"), ("ent", "actor/entropy", "{:.3f}"), ("clip", "actor/pg_clipfrac", "{:.3f}"),
    ("gnorm", "actor/grad_norm", "{:.3f}"), ("len", "response_length/mean", "{:.1f}"),
    ("max", "response_length/max", "{:.0f}"), ("cut", "response_length/clip_ratio", "{:.2f}"),
    ("tok/s", "perf/throughput", "{:.0f}"), ("mem", "perf/max_memory_gb", "{:.2f}GB"),
)
OPTIONAL = frozenset({"critic/acc/mean", "critic/format/mean"})
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync_weights")


def _stats(prefix: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """mean/std/max/min over the (masked) entries as 0-dim tensors: no host sync here (0 when empty)."""
    values = values.float()
    mask = torch.ones_like(values) if mask is None else mask.float()
    count = mask.sum().clamp(min=1.0)
    mean = (values * mask).sum() / count
    std = (((values - mean) ** 2) * mask).sum().div(count).sqrt()
    any_valid = mask.sum() > 0
    big = torch.finfo(torch.float32).max
    high = torch.where(mask.bool(), values, -big).max().where(any_valid, torch.zeros(()).to(values))
    low = torch.where(mask.bool(), values, big).min().where(any_valid, torch.zeros(()).to(values))
    return {f"{prefix}/mean": mean, f"{prefix}/std": std, f"{prefix}/max": high, f"{prefix}/min": low}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's critic/vf_explained_var: 1 - Var[returns - values] / (Var[returns] + 1e-5) over valid tokens.

    >>> r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    >>> m = torch.ones_like(r)
    >>> float(explained_variance(r, r, m)), round(float(explained_variance(torch.zeros_like(r), r, m)), 4)
    (1.0, 0.0)
    """
    return 1.0 - masked_var(returns - values, mask) / (masked_var(returns, mask) + 1e-5)


def to_floats(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """One device-to-host copy for all of a step's batch statistics."""
    return dict(zip(tensors, torch.stack(list(tensors.values())).tolist())) if tensors else {}


def peak_memory_gb() -> float:
    if torch.cuda.is_available():
        return max(RUN_PEAK[0], torch.cuda.max_memory_allocated()) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def step_metrics(batch: dict, loss_metrics: dict, extra: dict, timings: dict, ctx,
                 max_response_length: int | None = None) -> dict[str, float]:
    """Everything logged for one step, reduced over DP (batch statistics are over the global batch).
    With `max_response_length`: response_length/clip_ratio, the fraction of responses that hit it (verl)."""
    g = {k: gather_dp(batch[k], ctx) for k in ("token_level_scores", "token_level_rewards", "response_mask",
                                                "response_lengths", "prompt_lengths", "advantages", "returns")}
    mask = g["response_mask"]
    stats = {**_stats("critic/score", g["token_level_scores"].sum(-1)),
             **_stats("critic/rewards", g["token_level_rewards"].sum(-1)),
             **_stats("critic/advantages", g["advantages"], mask), **_stats("critic/returns", g["returns"], mask),
             **_stats("response_length", mask.sum(-1)),  # policy tokens (the loss mask; tool output not counted)
             **_stats("prompt_length", g["prompt_lengths"])}
    if "values" in batch:
        values = gather_dp(batch["values"], ctx)
        stats.update(_stats("critic/values", values, mask))
        stats["critic/vf_explained_var"] = explained_variance(values, g["returns"], mask)
    if max_response_length is not None and "response_length/clip_ratio" not in stats:
        stats["response_length/clip_ratio"] = (g["response_lengths"] >= max_response_length).float().mean()
    stats["perf/total_num_tokens"] = (g["response_lengths"] + g["prompt_lengths"]).sum().float()
    metrics = to_floats(stats)
    metrics.update({k: float(v) for k, v in extra.items()})
    metrics.update(loss_metrics)
    kl = metrics.get("actor/kl_loss", metrics.get("actor/reward_kl"))
    if kl is not None:
        metrics["actor/kl"] = kl
    step_time = sum(timings.values())
    metrics.update({f"timing_s/{k}": v for k, v in timings.items()})
    metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / max(step_time, 1e-9) / ctx.dims.world_size
    metrics["perf/max_memory_gb"] = peak_memory_gb()
    metrics.update({f"perf/max_memory_gb/{k}": v / 2**30 for k, v in take_phase_peaks().items()})  # CUDA: each phase
    metrics.update({f"perf/device_used_gb/{k}": v / 2**30 for k, v in take_device_used().items()})  # every process
    return metrics


def format_step_line(step: int, total: int, m: dict) -> str:
    """One fixed-format line: the same fields in the same order every step."""
    parts = [f"step {step}/{total}"]
    for label, key, fmt in LINE_FIELDS:
        shown = "" if key not in m and key in OPTIONAL else f"{label} {fmt.format(m[key]) if key in m else '-'}"
        parts.append(shown)
    phases = " ".join(f"{p} {m[f'timing_s/{p}']:.1f}s" for p in PHASES if f"timing_s/{p}" in m)
    groups = [" ".join(filter(None, parts[i:j])) for i, j in ((1, 5), (5, 11), (11, None))]
    if "num_turns/mean" in m:  # rollout.mode=multi_turn
        shown = "multi_turn: turns {:.2f} (max {:.0f}) tools {:.2f} (called {:.0%}) err {:.2f} t/o {:.2f}"
        groups.append(shown.format(
            *(m.get(k, 0.0) for k in ("num_turns/mean", "num_turns/max", "tool_calls/mean", "tool/call_rate",
                                      "tool/error_rate", "tool/timeout_rate"))))
    if "filter_groups/num_gen_batches" in m:  # dynamic sampling (algorithm.filter_groups.enable)
        groups.append("rounds {:.0f} kept {:.0f} filtered {:.0f}".format(
            *(m.get(f"filter_groups/{k}", 0.0) for k in ("num_gen_batches", "num_kept", "num_filtered"))))
    return " | ".join([parts[0], *groups, phases])


def mfu_metrics(metrics: dict, hf: dict, cfg, world_size: int, peak: float | None) -> dict[str, float]:
    """verl's perf/mfu/actor (and /critic): model FLOPs of each update (forward + backward, ppo_epochs times
    over the step's tokens) over its seconds; empty without a known device peak (CPU, fp32).

    >>> hf = {"hidden_size": 4, "num_hidden_layers": 1, "intermediate_size": 8, "num_attention_heads": 2,
    ...       "num_key_value_heads": 1, "vocab_size": 10}
    >>> from types import SimpleNamespace as S
    >>> cfg = S(actor=S(ppo_epochs=1), critic=S(ppo_epochs=1), data=S(train_batch_size=1), rollout=S(n=2))
    >>> mfu_metrics({"perf/total_num_tokens": 6.0, "timing_s/update_actor": 1.0}, hf, cfg, 1, 1e4)
    {'perf/mfu/actor': 0.7488}
    """
    from rlhf_mcore.models.flops import mfu

    tokens = metrics.get("perf/total_num_tokens", 0.0)
    seq = tokens / max(cfg.data.train_batch_size * cfg.rollout.n, 1)
    out = {}
    for role in ("actor", "critic"):
        seconds = metrics.get(f"timing_s/update_{role}")
        model = hf if role == "actor" else {**hf, "vocab_size": 1}  # the critic's head is a scalar
        value = mfu(model, tokens, seq, 3.0 * getattr(cfg, role).ppo_epochs, seconds or 0.0, world_size, peak) \
            if seconds else None
        if value is not None:
            out[f"perf/mfu/{role}"] = value
    return out
