"""Tiny models for the in-process checkpoint tests (one rank, TP1/PP1)."""
from __future__ import annotations

import dataclasses

import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.trainer.optim import build_train_state
from tests.support.tiny import tiny_model_config


def build_state(ctx, role: str = "actor", distopt: bool = False, **model_overrides):
    """A TrainState (DDP model + megatron Adam) of a tiny model."""
    cfg = tiny_model_config(**model_overrides)
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, use_distributed_optimizer=distopt))
    return build_train_state(build_tiny(ctx, role, **model_overrides), cfg.actor.optim, cfg.parallel)


def build_tiny(ctx, role: str = "actor", **model_overrides):
    cfg = tiny_model_config(**model_overrides)
    return build_model(role, load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)


@torch.no_grad()
def perturb(model, seed: int) -> None:
    """Change every weight (stands in for a training step where only the values matter)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen).to(p.device) * 0.01)


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
