"""Per-phase peaks of one rank: the resident terms (`plan.static`) plus what each RL phase adds (`plan.dynamic`,
`plan.rollout`). The phases are the trainer's timed ones (`perf/max_memory_gb/<phase>` measures each):

- rollout (gen): the native engine's KV cache and its prefill or decode step (`plan.rollout`); SGLang instead takes
  `rollout.sglang.gpu_memory_utilization` of the device (weights and KV cache), so it is only planned when the
  device's memory is known. `trainer.offload_during_rollout` moves Adam's moments to the host and frees the gradient
  buffers for it; the fp32 main weights stay (`plan.static.main_param_bytes`).
- log_prob (old_log_prob, ref): forward only, one layer's live tensors and the fused kernel's chunk of logits.
- values (a critic's forward), critic_update (its forward and backward): the critic's own micro-batches.
- update (update_actor): the activations a micro-batch keeps for its backward, the head's, and the fused log-prob
  kernel's backward buffers; optimizer: the optimizer step inside it (fused AdamW: nothing past the resident).
Every phase after the rollout also holds what the engine keeps (`plan.rollout.resident_cache_bytes`).
A vision LM's towers are resident too (`plan.static.tower_bytes`: weights, and gradients and Adam's state of a
trained one); the activations of the tower's forward (one micro-batch's images, freed before the LM's) are not
counted, nor does trainer.offload_during_rollout move a trained tower's state in the plan.
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.plan.dynamic import (
    Batch,
    activation_bytes,
    forward_layer_bytes,
    head_activation_bytes,
    logprob_backward_bytes,
    logprob_bytes,
)
from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape, experts_per_token
from rlhf_mcore.plan.rollout import lora_on_fc1, resident_cache_bytes, rollout_terms
from rlhf_mcore.plan.static import Layout, main_param_bytes, roles_of, stage_bytes, tower_bytes

PHASES = ("rollout", "log_prob", "values", "update", "critic_update", "optimizer")


def lora_layer_elements(cfg) -> int:
    """What LoRA adds to a layer's saved activations, per token: each adapted linear's x A^T ([n x r] for its n
    adapted sub-projections), saved for B's gradient (`models.lora`; x itself is the base linear's saved input).

    >>> from rlhf_mcore.config import Config, ModelConfig
    >>> lora_layer_elements(Config(model=ModelConfig(lora_rank=8, target_modules=["all-linear"])))  # 7 x 8
    56
    """
    if not cfg.model.lora_rank:
        return 0
    from rlhf_mcore.models.lora import LoraSettings

    return len(LoraSettings.from_model_cfg(cfg.model).target_modules) * cfg.model.lora_rank


def phase_terms(cfg, shape: Shape, layout: Layout, gpu_bytes: float = 0.0, pp_rank: int = 0,
                experts_per_token: int = 1) -> dict[str, dict[str, int]]:
    """{phase: {term: bytes}} on a rank of pipeline stage `pp_rank` (a critic's phases only with a critic)."""
    dtype, tp, pp, div = cfg.model.dtype, layout.tp, layout.pp, cfg.model.make_vocab_size_divisible_by
    roles = roles_of(cfg)
    static = stage_bytes(shape, layout, pp_rank, roles, dtype, cfg.parallel.use_distributed_optimizer, div)
    weights = sum(t["weights"] for t in static.values())
    training = sum(t["grads"] + t["optimizer"] for t in static.values())
    batch = Batch.of(cfg, layout.dp)
    kept = main_param_bytes(static, dtype) if cfg.trainer.offload_during_rollout else training
    rollout = {"weights": weights, "grads+optimizer": kept}
    tower = tower_bytes(shape, roles, dtype, layout.dp, cfg.parallel.use_distributed_optimizer,
                        not cfg.model.freeze_vision_tower)
    rollout.update({"tower": tower} if tower else {})
    if cfg.rollout.engine == "sglang":
        rollout["sglang"] = int(cfg.rollout.sglang.gpu_memory_utilization * gpu_bytes)
    else:
        rollout.update(rollout_terms(cfg, shape, batch.rows, batch.length, batch.prompt, tp, pp, dtype, div,
                                     experts_per_token, layout.ep))
    resident = {"weights": weights, "grads+optimizer": training, **({"tower": tower} if tower else {})}
    cache = resident_cache_bytes(cfg, shape, batch.rows, batch.length, batch.prompt, tp, pp, dtype)
    resident.update({"rollout_cache": cache} if cache else {})
    forward = forward_layer_bytes(shape, batch.forward_tokens, tp, dtype, experts_per_token, lora_on_fc1(cfg),
                                  layout.ep)
    phases = {
        "rollout": rollout,
        "log_prob": {**resident, "activations": forward,
                     "logprob": logprob_bytes(shape, batch.forward_tokens, tp, div)},
        "update": {**resident, **update_terms(cfg, shape, layout, batch.update_tokens, experts_per_token),
                   "logprob": logprob_backward_bytes(shape, batch.update_tokens, tp, dtype,
                                                     not cfg.model.lora_rank, div)},
        "optimizer": dict(resident),
    }
    if any(r.name == "critic" for r in roles):
        phases["values"] = {**resident, "activations": forward}
        phases["critic_update"] = {**resident, **update_terms(cfg, shape, layout, batch.critic_tokens,
                                                              experts_per_token, lora=False)}
    return {p: phases[p] for p in PHASES if p in phases}


def update_terms(cfg, shape: Shape, layout: Layout, tokens: int, experts_per_token: int = 1,
                 lora: bool = True) -> dict[str, int]:
    """A trained role's saved activations over a micro-batch of `tokens` (padded micro-batches: SDPA's output
    copy, `plan.dynamic.layer_activation_bytes`), with LoRA's, and the head's."""
    dtype, tp, pp = cfg.model.dtype, layout.tp, layout.pp
    out_copy = not cfg.data.use_sequence_packing and cfg.model.sdpa_kernel != "cudnn"
    saved = activation_bytes(shape, tokens, tp, pp, dtype, cfg.model.recompute, experts_per_token, out_copy)
    if lora and cfg.model.recompute != "full":
        saved += (shape.layers // pp) * lora_layer_elements(cfg) * tokens * pp * WEIGHT_BYTES[dtype]
    terms = {"activations": saved}
    if pp == 1:  # the stage holds the head too (at PP > 1 the first stage's in-flight activations are planned)
        terms["head"] = head_activation_bytes(shape, tokens, dtype)
    return terms


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
    top_k = experts_per_token(hf)
    phase, total, stage = rank_peak(cfg, shape, layout, gpu_bytes, top_k)
    return RunPlan(layout, phase, total, phase_terms(cfg, shape, layout, gpu_bytes, stage, top_k)[phase])


MARGIN = 0.08  # of the device's memory a plan that fits leaves free (the CUDA context, the allocator's fragmentation)


def cache_release_reason(cfg, device_bytes: float, world_size: int | None = None) -> str:
    """Why the native engine should free its static decoder's cache (and merged LoRA copy) after each rollout
    although rollout.native.keep_graphs asks to keep them: the plan's peak phase holds them and leaves less than
    MARGIN of the device free ('' when it does not, or no plan can be made). Measured on an H200: a Qwen3-VL-4B
    step planned at 98% of the device with the cache ran out of memory in its update."""
    try:
        plan = run_plan(cfg, world_size, device_bytes)
    except (OSError, ValueError):
        return ""
    cache = plan.terms.get("rollout_cache", 0) + plan.terms.get("merged_lora", 0)
    if not cache or plan.total <= (1 - MARGIN) * device_bytes:
        return ""
    return (f"the memory plan's {plan.phase} phase needs {size(plan.total)} of the device's {size(device_bytes)} "
            f"({plan.total / device_bytes:.0%}) with the decoder's cache kept ({size(cache)})")


def as_engine_runs(cfg, device_bytes: float, world_size: int | None = None):
    """(the config as the native engine runs it on this device, why it differs): rollout.native.keep_graphs off
    where `cache_release_reason` gives one (the engine frees its cache then), else the config itself and ''."""
    reason = cache_release_reason(cfg, device_bytes, world_size)
    if not reason:
        return cfg, ""
    native = dataclasses.replace(cfg.rollout.native, keep_graphs=False)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, native=native)), reason


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
