"""The static terms of the memory plan, per rank: weights, gradients and optimizer state of every role a run
builds, at a TP x PP x EP x DP layout, from the exact parameter counts of `plan.params`.

- weights: every role in `model.dtype` (2 bytes bf16, 4 fp32);
- gradients (trained roles): megatron's DDP buffer, in fp32 (`grad_reduce_in_fp32`): 4 bytes a parameter;
- optimizer state (trained roles): Adam's two moments in fp32, plus fp32 main weights in a bf16 run: 12 bytes a
  parameter (8 in fp32); the distributed optimizer shards it over DP.
The roles: the actor, the reference (a frozen copy, where a KL term needs one and LoRA does not make it free), the
critic (GAE), LoRA's adapters (trained; the base is the frozen actor) and a reward model (`reward.model_path`,
its own shape); a vision LM's tower + merger, whole on every rank (`tower_bytes`). A rank's peak is its pipeline
stage's largest sum (the first and last stages hold the embedding and the head).
"""
from __future__ import annotations

import dataclasses

from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape, rank_expert_params, rank_params

GRAD_BYTES = 4
ADAM_BYTES = {"bf16": 12, "fp32": 8}
MAIN_BYTES = {"bf16": 4, "fp32": 0}  # of ADAM_BYTES: megatron's fp32 main weights of a bf16 model


@dataclasses.dataclass(frozen=True)
class Role:
    name: str
    trained: bool
    lm_head: bool = True
    shape: Shape | None = None  # another model's shape (the reward model); None: the run's model
    whole: int = 0  # parameters split evenly over TP x PP instead of a shape's count (LoRA's adapters)
    whole_experts: int = 0  # of them, the routed experts' (LoRA on expert MLPs): split over EP x PP instead


@dataclasses.dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    ep: int
    dp: int

    def __str__(self) -> str:
        return f"TP{self.tp} PP{self.pp} EP{self.ep} DP{self.dp}"

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same routed experts (megatron's expert-data-parallel group, etp 1): tp x dp / ep; 1 for
        a config's own ep planned on too few GPUs (`phases.run_plan` at --gpus), which validation refuses anyway."""
        return max(self.tp * self.dp // self.ep, 1)


def roles_of(cfg) -> list[Role]:
    """The roles a run builds (LoRA's adapters and a reward model read their config.json files)."""
    from rlhf_mcore.algorithms.advantages import estimator_needs

    roles = [Role("actor", trained=not cfg.model.lora_rank)]  # LoRA: a frozen base, and the "adapters" role
    kl = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    if kl and not cfg.model.lora_rank:  # LoRA's reference is the actor with its adapters off
        roles.append(Role("ref", trained=False))
    if estimator_needs(cfg.algorithm.adv_estimator).critic:
        roles.append(Role("critic", trained=True, lm_head=False))
    if cfg.model.lora_rank:
        roles.append(Role("adapters", trained=True, **adapter_params(cfg)))
    if cfg.reward.model_path:
        roles.append(Role("reward", trained=False, lm_head=False, shape=reward_shape(cfg.reward.model_path)))
    return roles


def adapter_params(cfg) -> dict[str, int]:
    """{whole, whole_experts}: the actor's LoRA adapters over the whole model, and those on routed experts
    (`models.lora_budget`)."""
    from rlhf_mcore.models.lora import LoraSettings
    from rlhf_mcore.models.lora_budget import MLP, lora_param_count
    from rlhf_mcore.models.spec import num_experts
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.models.weights import model_dims

    hf = load_hf_config(cfg.model)
    settings = LoraSettings.from_model_cfg(cfg.model)
    dims, moe = model_dims(hf, "config.json"), bool(num_experts(hf))
    experts = [t for t in settings.target_modules if t in MLP] if moe else []
    return {"whole": lora_param_count(dims, settings.rank, settings.target_modules, moe=moe),
            "whole_experts": lora_param_count(dims, settings.rank, experts, moe=True) if experts else 0}


def reward_shape(path: str) -> Shape:
    """The reward model's shape, from its HF directory or its conversion's hf/config.json."""
    from rlhf_mcore.trainer.roles import reward_model_config

    return Shape.of(reward_model_config(path)[0])


def role_bytes(params: int, role: Role, dtype: str, dp: int, distributed_optimizer: bool, experts: int = 0,
               expert_dp: int = 1) -> dict[str, int]:
    """{weights, grads, optimizer} bytes of one role's `params` on one rank. `experts` of them are routed experts:
    the distributed optimizer shards those over the expert-data-parallel group (`expert_dp` ranks, megatron's
    expert buffers), the rest over dp.

    >>> role_bytes(1000, Role("actor", trained=True), "bf16", dp=4, distributed_optimizer=True)
    {'weights': 2000, 'grads': 4000, 'optimizer': 3000}
    >>> role_bytes(1000, Role("actor", trained=True), "bf16", 4, True, experts=800, expert_dp=1)["optimizer"]
    10200

    (200 dense parameters x 12 B / 4 ranks = 600, 800 expert parameters x 12 B on their one rank = 9600.)
    """
    optimizer = params * ADAM_BYTES[dtype] if role.trained else 0
    if distributed_optimizer and optimizer:
        optimizer = -(-(params - experts) * ADAM_BYTES[dtype] // dp) - (-experts * ADAM_BYTES[dtype] // expert_dp)
    return {"weights": params * WEIGHT_BYTES[dtype], "grads": params * GRAD_BYTES if role.trained else 0,
            "optimizer": optimizer}


def main_param_bytes(static: dict[str, dict[str, int]], dtype: str) -> int:
    """What of the optimizer state stays on the device when `trainer.optim.offload_for_rollout` moves Adam's
    moments to the host (and frees the gradient buffers): the fp32 main weights.

    >>> main_param_bytes({"actor": {"weights": 2000, "grads": 4000, "optimizer": 3000}}, "bf16")
    1000
    """
    return sum(t["optimizer"] for t in static.values()) * MAIN_BYTES[dtype] // ADAM_BYTES[dtype]


def stage_bytes(shape: Shape, layout: Layout, pp_rank: int, roles: list[Role], dtype: str,
                distributed_optimizer: bool, vocab_divisible_by: int = 128) -> dict[str, dict[str, int]]:
    """{role: {weights, grads, optimizer}} on a rank of pipeline stage `pp_rank`."""
    def params(r: Role) -> int:
        if r.whole:
            return -(-(r.whole - r.whole_experts) // (layout.tp * layout.pp)) + experts(r)
        return rank_params(r.shape or shape, layout.tp, layout.pp, layout.ep, pp_rank, r.lm_head, vocab_divisible_by)

    def experts(r: Role) -> int:
        if r.whole:
            return -(-r.whole_experts // (layout.ep * layout.pp))
        return rank_expert_params(r.shape or shape, layout.pp, layout.ep)
    return {r.name: role_bytes(params(r), r, dtype, layout.dp, distributed_optimizer, experts(r), layout.expert_dp)
            for r in roles}


def tower_bytes(shape: Shape, roles: list[Role], dtype: str, dp: int, distributed_optimizer: bool,
                trained: bool) -> int:
    """A vision LM's towers on a rank (whole on every rank): the actor's (with its gradients and optimizer state
    when `trained`, model.freeze_vision_tower=false) and the frozen copies of the reference and the critic.

    >>> roles = [Role("actor", trained=True), Role("ref", trained=False)]
    >>> tower_bytes(Shape(1, 8, 16, 2, 1, 4, 10, tower=100), roles, "bf16", 1, True, trained=False)  # 2 x 100 x 2
    400
    >>> tower_bytes(Shape(1, 8, 16, 2, 1, 4, 10, tower=100), roles, "bf16", 1, True, trained=True)  # + 4 + 12 a param
    2000
    """
    holders = [r for r in roles if r.name in ("actor", "ref", "critic")]
    total = 0
    for r in holders:
        terms = role_bytes(shape.tower, Role(r.name, trained and r.name == "actor"), dtype, dp, distributed_optimizer)
        total += sum(terms.values())
    return total


def peak_bytes(shape: Shape, layout: Layout, roles: list[Role], dtype: str, distributed_optimizer: bool,
               vocab_divisible_by: int = 128) -> int:
    """The largest static total over the pipeline stages."""
    return max(sum(sum(terms.values()) for terms in stage_bytes(shape, layout, s, roles, dtype, distributed_optimizer,
                                                                 vocab_divisible_by).values())
               for s in range(layout.pp))


def layouts(shape: Shape, gpus: int) -> list[Layout]:
    """Every TP x PP x EP x DP of `gpus` that the model allows: TP divides the heads, KV groups and MLP size, PP the
    layers; EP divides the experts and TP x DP (an expert group spans a stage's tensor- and data-parallel ranks)."""
    found = []
    for tp in _divisors(gpus):
        if shape.heads % tp or shape.groups % tp or shape.ffn % tp:
            continue
        for pp in _divisors(gpus // tp):
            if shape.layers % pp:
                continue
            dp = gpus // (tp * pp)
            for ep in _divisors(tp * dp) if shape.experts else [1]:
                if not shape.experts % ep:
                    found.append(Layout(tp, pp, ep, dp))
    return found


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
