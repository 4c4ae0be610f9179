"""Build every model role on every rank, in the one TP/PP/DP group: actor (trained), critic (trained, when
the advantage estimator needs values), reference (frozen, when KL is used) and reward model (frozen,
when reward.model_path is set). With LoRA (model.lora_rank > 0) the reference is the actor with its adapters
off (`models.lora.AdaptersOff`): no second copy of the weights."""
from __future__ import annotations

import copy
import dataclasses
import logging

import torch

from rlhf_mcore.algorithms.advantages import estimator_needs
from rlhf_mcore.models.build import build_model, count_parameters
from rlhf_mcore.models.families.vision_family import text_config
from rlhf_mcore.models.hf_load import has_hf_weights, load_hf_weights, weight_source
from rlhf_mcore.models.lora import AdaptersOff, LoraSettings, is_adapter_name, is_lora_model
from rlhf_mcore.models.lora_budget import describe, lora_budget
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.roles import ROLES
from rlhf_mcore.models.spec import num_experts
from rlhf_mcore.models.vision import TOWER_NAME, attach_tower, build_run_tower, vision_side
from rlhf_mcore.trainer.optim import TrainState, build_train_state

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Roles:
    actor: TrainState
    critic: TrainState | None
    ref: torch.nn.Module | None
    reward: torch.nn.Module | None

    def trainable(self) -> dict[str, TrainState]:
        return {name: s for name, s in (("actor", self.actor), ("critic", self.critic)) if s is not None}


def copy_weights(src: torch.nn.Module, dst: torch.nn.Module, skip_prefixes: tuple[str, ...] = ()) -> None:
    """Copy src's weights into dst (same layout on this rank), leaving dst's `skip_prefixes` as built. LoRA
    adapters are never copied (each role has its own, from their seeds)."""
    state = {k: v for k, v in src.state_dict().items() if not k.startswith(skip_prefixes) and not is_adapter_name(k)}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(skip_prefixes) and not is_adapter_name(k)]
    if missing or unexpected:
        raise ValueError(f"copying weights between roles: missing {missing}, unexpected {unexpected}")


def _load_or_none(model, path: str, what: str) -> None:
    if path:
        from rlhf_mcore.checkpoint import load_model_weights

        load_model_weights(model, path)
        log.info("%s: weights from %s", what, path)


def _init_from_actor_or(model, path: str, what: str, actor, skip: tuple[str, ...] = ()) -> None:
    """Weights from the role's own checkpoint when one is set, else the actor's (minus `skip`ped heads)."""
    if path:
        _load_or_none(model, path, what)
    else:
        copy_weights(actor, model, skip_prefixes=skip)


def needs_critic(cfg) -> bool:
    return estimator_needs(cfg.algorithm.adv_estimator).critic


REPLAY_MODES = {"R2": "R2, the update replays the old-log-prob pass's experts",
                "R3": "R3, every pass replays the experts the rollout used"}


def needs_ref(cfg) -> bool:
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def reward_model_config(path: str) -> tuple[dict, bool]:
    """(HF config, whether `path` is an HF directory with weights) of the reward model: an HF
    *ForSequenceClassification directory, or a converted one (tools/convert_checkpoint.py writes <path>/hf/)."""
    import json
    import os

    direct = os.path.isfile(os.path.join(path, "config.json")) and has_hf_weights(path)
    config = os.path.join(path, "config.json") if direct else os.path.join(path, "hf", "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"reward.model_path: no config.json with weights, nor hf/config.json, in {path!r}. Pass "
                         "an HF *ForSequenceClassification directory or its tools/convert_checkpoint.py output.")
    with open(config) as f:
        return json.load(f), direct


def _init_actor(model, cfg, hf: dict, ctx, source: tuple[str, str]) -> None:
    kind, where = source
    if kind == "load":
        _load_or_none(model, where, "actor")
    elif kind == "hf":
        log.info("actor: weights from HF %s", load_hf_weights(model, where, hf, ctx.tp_rank, ctx.dims.tp))
    else:
        log.info("actor: random initial weights (%s)", where)
    if cfg.model.lora_adapter_path:  # a resume's checkpoint then holds the trained adapters, loaded after this
        from rlhf_mcore.models.lora_export import load_peft_adapter

        log.info("actor: LoRA adapters from PEFT %s", load_peft_adapter(model, cfg.model.lora_adapter_path, hf, ctx))


def build_reference(cfg, hf: dict, ctx, actor_model):
    """The reference policy: the LoRA actor with its adapters off (unless ref.load names its own weights),
    else a frozen copy of the actor's initial weights (a vision LM's tower too)."""
    if is_lora_model(actor_model) and not cfg.ref.load:
        return AdaptersOff(actor_model)
    ref = build_model("ref", hf, cfg.model, cfg.parallel, ctx)
    _init_from_actor_or(ref, cfg.ref.load, "ref", actor_model, skip=(f"{TOWER_NAME}.",))
    copy_tower(actor_model, ref, hf)
    return ref


def attach_run_tower(model, cfg, hf: dict, ctx) -> None:
    """A vision LM's actor: its tower (model.hf_path's or model.load's weights, or random), frozen unless
    model.freeze_vision_tower=false; nothing for a text model."""
    if spec_for_hf_config(hf).vision_prefix is None:
        return
    tower, where = build_run_tower(hf, cfg.model, ctx.device, next(model.parameters()).dtype, cfg.trainer.seed)
    attach_tower(model, tower, hf, trainable=not cfg.model.freeze_vision_tower)
    log.info("actor: vision tower %s, %.1fM parameters, %s", where, count_parameters(tower) / 1e6,
             "frozen (model.freeze_vision_tower=true)" if cfg.model.freeze_vision_tower else "trained")


def copy_tower(src, dst, hf: dict) -> None:
    """dst gets a frozen copy of src's vision tower (a vision LM's critic or reference)."""
    side = vision_side(src)
    if side is not None:
        attach_tower(dst, copy.deepcopy(side.tower), hf, trainable=False)


def log_lora(cfg, hf: dict, ctx, ref) -> None:
    """The start-up line of each LoRA role: trainable parameters and the memory not spent."""
    for role, rank in (("actor", cfg.model.lora_rank), ("critic", cfg.critic.lora_rank if needs_critic(cfg) else 0)):
        settings = LoraSettings.from_model_cfg(cfg.model, rank=rank)
        if settings is None:
            continue
        kind = "none" if ref is None or role == "critic" else "shared" if isinstance(ref, AdaptersOff) else "separate"
        budget = lora_budget(hf, settings, cfg.model.dtype, ctx.dims.tp, ctx.dims.pp, ctx.dims.dp,
                             cfg.parallel.use_distributed_optimizer, ref_shared=kind == "shared")
        log.info("%s %s", role, describe(budget, settings, kind))


def build_roles(cfg, hf: dict, ctx) -> Roles:
    source = weight_source(cfg.model)  # raises before any model is built
    actor_model = build_model("actor", hf, cfg.model, cfg.parallel, ctx)
    _init_actor(actor_model, cfg, hf, ctx, source)
    attach_run_tower(actor_model, cfg, hf, ctx)
    log.info("actor: %.1fM parameters on this rank", count_parameters(actor_model) / 1e6)
    experts = num_experts(text_config(hf))  # a vision LM nests the LM's fields under text_config
    if experts:
        log.info("actor: MoE, %d experts, %d on this rank (parallel.ep=%d); routing replay: %s", experts,
                 experts // cfg.parallel.ep, cfg.parallel.ep,
                 REPLAY_MODES.get(cfg.actor.router_replay, "off (actor.router_replay=disabled)"))
    ref = build_reference(cfg, hf, ctx, actor_model) if needs_ref(cfg) else None
    critic = None
    if needs_critic(cfg):
        critic_model = build_model("critic", hf, cfg.model, cfg.parallel, ctx,
                                   lora=LoraSettings.from_model_cfg(cfg.model, rank=cfg.critic.lora_rank))
        _init_from_actor_or(critic_model, cfg.critic.load, "critic", actor_model,
                            skip=ROLES["critic"].skip_from_actor + (f"{TOWER_NAME}.",))
        copy_tower(actor_model, critic_model, hf)
        if not cfg.critic.load and cfg.critic.value_head_init == "zeros" and ctx.is_last_stage:
            torch.nn.init.zeros_(critic_model.output_layer.weight)  # values start at 0
        critic = build_train_state(critic_model, cfg.critic.optim, cfg.parallel)
    reward = None
    if cfg.reward.model_path:
        reward_hf, direct = reward_model_config(cfg.reward.model_path)
        reward = build_model("reward", reward_hf, cfg.model, cfg.parallel, ctx)
        if direct:
            log.info("reward model: weights from HF %s",
                     load_hf_weights(reward, cfg.reward.model_path, reward_hf, ctx.tp_rank, ctx.dims.tp))
        else:
            _load_or_none(reward, cfg.reward.model_path, "reward model")
    log_lora(cfg, hf, ctx, ref)
    return Roles(actor=build_train_state(actor_model, cfg.actor.optim, cfg.parallel), critic=critic, ref=ref,
                 reward=reward)
