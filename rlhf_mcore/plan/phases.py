"""Per-phase peaks of one rank: the resident terms (`plan.static`) plus what each RL phase adds (`plan.dynamic`).

- rollout: the native engine's KV cache for the rank's rows over the prompt + response budget and a decode step's
  logits; SGLang instead takes `rollout.sglang.gpu_memory_utilization` of the device (weights and KV cache), so it
  is only planned when the device's memory is known. `trainer.offload_during_rollout` moves the gradients and the
  optimizer state off the device for it.
- log_prob: old / reference log-probs and values, forward only, one layer's activations at a time and the fused
  kernel's chunk of logits.
- update: the activations a micro-batch keeps for its backward and the log-prob chunk with its gradient.
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.plan.dynamic import (
    Batch,
    activation_bytes,
    decode_logits_bytes,
    kv_cache_bytes,
    layer_activation_elements,
    logprob_bytes,
)
from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape
from rlhf_mcore.plan.static import Layout, roles_of, stage_bytes

PHASES = ("rollout", "log_prob", "update")


def phase_terms(cfg, shape: Shape, layout: Layout, gpu_bytes: float = 0.0, pp_rank: int = 0,
                experts_per_token: int = 1) -> dict[str, dict[str, int]]:
    """{phase: {term: bytes}} on a rank of pipeline stage `pp_rank`."""
    dtype, tp, pp, div = cfg.model.dtype, layout.tp, layout.pp, cfg.model.make_vocab_size_divisible_by
    static = stage_bytes(shape, layout, pp_rank, roles_of(cfg), dtype, cfg.parallel.use_distributed_optimizer, div)
    weights = sum(t["weights"] for t in static.values())
    training = sum(t["grads"] + t["optimizer"] for t in static.values())
    batch = Batch.of(cfg, layout.dp)
    rollout = {"weights": weights, "grads+optimizer": 0 if cfg.trainer.offload_during_rollout else training}
    if cfg.rollout.engine == "sglang":
        rollout["sglang"] = int(cfg.rollout.sglang.gpu_memory_utilization * gpu_bytes)
    else:
        rollout["kv_cache"] = kv_cache_bytes(shape, batch.rows, batch.length, tp, pp, dtype)
        rollout["decode_logits"] = decode_logits_bytes(shape, batch.rows, tp, div)
    resident = {"weights": weights, "grads+optimizer": training}
    one_layer = layer_activation_elements(shape, tp) * batch.forward_tokens * WEIGHT_BYTES[dtype]
    return {
        "rollout": rollout,
        "log_prob": {**resident, "activations": one_layer,
                     "logprob": logprob_bytes(shape, batch.forward_tokens, tp, backward=False, divisible_by=div)},
        "update": {**resident, "activations": activation_bytes(shape, batch.update_tokens, tp, pp, dtype,
                                                               cfg.model.recompute, experts_per_token),
                   "logprob": logprob_bytes(shape, batch.update_tokens, tp, backward=True, divisible_by=div)},
    }


def peak(terms: dict[str, dict[str, int]]) -> tuple[str, int]:
    """(the phase with the largest total, that total).

    >>> peak({"rollout": {"a": 3, "b": 4}, "update": {"a": 3, "c": 5}})
    ('update', 8)
    """
    totals = {phase: sum(t.values()) for phase, t in terms.items()}
    phase = max(totals, key=totals.get)
    return phase, totals[phase]


def rank_peak(cfg, shape: Shape, layout: Layout, gpu_bytes: float = 0.0, experts_per_token: int = 1
              ) -> tuple[str, int, int]:
    """(phase, bytes, pipeline stage) of the largest peak over the stages of `layout`."""
    found = []
    for stage in range(layout.pp):
        phase, total = peak(phase_terms(cfg, shape, layout, gpu_bytes, stage, experts_per_token))
        found.append((phase, total, stage))
    return max(found, key=lambda f: f[1])


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run's plan at its own layout: the largest phase's bytes per rank and that phase's terms."""

    layout: Layout
    phase: str
    total: int
    terms: dict[str, int]


def run_plan(cfg, world_size: int | None = None, gpu_bytes: float = 0.0) -> RunPlan:
    """The plan at the config's TP x PP x EP with DP from `world_size` (else 1). Raises OSError / ValueError when
    the model's config.json cannot be read."""
    from rlhf_mcore.models.transformer_config import load_hf_config

    hf = load_hf_config(cfg.model)
    shape, p = Shape.of(hf), cfg.parallel
    layout = Layout(p.tp, p.pp, p.ep, max((world_size or p.tp * p.pp) // (p.tp * p.pp), 1))
    top_k = int(hf.get("num_experts_per_tok") or 1)
    phase, total, stage = rank_peak(cfg, shape, layout, gpu_bytes, top_k)
    return RunPlan(layout, phase, total, phase_terms(cfg, shape, layout, gpu_bytes, stage, top_k)[phase])


def plan_line(cfg, world_size: int | None = None, gpu_bytes: float = 0.0) -> str:
    """One line for `--validate-only` and `diagnose`: `run_plan`'s peak and terms; what reads no model config
    says why."""
    try:
        plan = run_plan(cfg, world_size, gpu_bytes)
    except (OSError, ValueError) as err:
        return f"memory plan: not made ({str(err).splitlines()[0]})"
    return (f"memory plan: {size(plan.total)} per rank at {plan.layout}, peak in the {plan.phase} phase ("
            + " + ".join(f"{k} {size(v)}" for k, v in plan.terms.items())
            + "); every layout: python -m rlhf_mcore.plan --config CFG --gpus N --gpu-memory GiB")


def size(nbytes: float) -> str:
    """GiB from 1 GiB up, MiB below.

    >>> size(3 * 2**30), size(5.5 * 2**20)
    ('3.00 GiB', '5.5 MiB')
    """
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
