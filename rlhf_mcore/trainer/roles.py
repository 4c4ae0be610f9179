"""Build every model role on every rank, in the one TP/PP/DP group: actor (trained), critic (trained, when
the advantage estimator needs values), reference (frozen, when KL is used) and reward model (frozen,
when reward.model_path is set)."""
from __future__ import annotations

import dataclasses
import logging

import torch

from rlhf_mcore.algorithms.advantages import estimator_needs
from rlhf_mcore.models.build import build_model, count_parameters
from rlhf_mcore.models.roles import ROLES
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
    """Copy src's weights into dst (same layout on this rank), leaving dst's `skip_prefixes` as built."""
    state = {k: v for k, v in src.state_dict().items() if not k.startswith(skip_prefixes)}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(skip_prefixes)]
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


def needs_ref(cfg) -> bool:
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def reward_model_config(path: str) -> dict:
    """The HF config of a converted reward model (tools/convert_checkpoint.py writes it to <path>/hf/)."""
    import json
    import os

    config = os.path.join(path, "hf", "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"reward.model_path: no hf/config.json in {path!r}. Convert the HF "
                         "*ForSequenceClassification checkpoint first: tools/convert_checkpoint.py hf-to-mcore.")
    with open(config) as f:
        return json.load(f)


def build_roles(cfg, hf: dict, ctx) -> Roles:
    actor_model = build_model("actor", hf, cfg.model, cfg.parallel, ctx)
    _load_or_none(actor_model, cfg.model.load, "actor")
    log.info("actor: %.1fM parameters on this rank", count_parameters(actor_model) / 1e6)
    ref = None
    if needs_ref(cfg):
        ref = build_model("ref", hf, cfg.model, cfg.parallel, ctx)
        _init_from_actor_or(ref, cfg.ref.load, "ref", actor_model)
    critic = None
    if needs_critic(cfg):
        critic_model = build_model("critic", hf, cfg.model, cfg.parallel, ctx)
        _init_from_actor_or(critic_model, cfg.critic.load, "critic", actor_model, skip=ROLES["critic"].skip_from_actor)
        critic = build_train_state(critic_model, cfg.critic.optim, cfg.parallel)
    reward = None
    if cfg.reward.model_path:
        reward = build_model("reward", reward_model_config(cfg.reward.model_path), cfg.model, cfg.parallel, ctx)
        _load_or_none(reward, cfg.reward.model_path, "reward model")
    return Roles(actor=build_train_state(actor_model, cfg.actor.optim, cfg.parallel), critic=critic, ref=ref,
                 reward=reward)
