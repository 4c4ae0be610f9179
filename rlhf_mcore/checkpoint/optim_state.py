"""Optimizer state in megatron's sharded (dist-checkpoint) form, for the plain and the distributed optimizer.

Formats, and what they support across layouts (tests/dist/checkpoint/test_resume_dist.py):
- plain optimizer (FP32Optimizer / Float16Optimizer): Adam moments are saved as tensors shaped like the
  model parameters (`optimizer.state.exp_avg.<param key>`), so megatron reshards them to any TP/PP/DP.
- DistributedOptimizer: saved as `fully_reshardable` (megatron 0.16's `fully_sharded_model_space` is
  refused by its own ShardedTensor check: flattened ranges are no longer supported). The DP shards are
  gathered on DP rank 0 over gloo into model-shaped `param`/`exp_avg`/`exp_avg_sq` tensors (host memory,
  no `.cuda()` call, so it runs on CPU too); every rank reads and slices what it owns on load. Reshards
  to any TP/PP/DP.
- Switching between the two kinds is refused (their non-tensor state differs): resume with the same
  `parallel.use_distributed_optimizer`.
The step count (Adam's bias correction) is restored exactly in both.
"""
from __future__ import annotations

import torch

DISTOPT_FORMAT = "fully_reshardable"
SHARDED_METADATA = {
    "distrib_optim_sharding_type": DISTOPT_FORMAT,
    # gather with gloo on DP rank 0 into host memory (the default all-gathers with `.cuda()` on every rank)
    "distrib_optim_fully_reshardable_mem_efficient": True,
    "chained_optim_avoid_prefix": True,
}


def sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def optimizer_kind(optimizer) -> str:
    """'DistributedOptimizer', 'FP32Optimizer', ... ('+'-joined for a chain of several)."""
    return "+".join(type(sub).__name__ for sub in sub_optimizers(optimizer))


def _is_distributed(sub) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return isinstance(sub, DistributedOptimizer)


def _torch_adams(optimizer) -> list:
    """The inner torch Adam/AdamW of each sub-optimizer (absent when TE/apex fused Adam is used)."""
    inners = [getattr(sub, "optimizer", None) for sub in sub_optimizers(optimizer)]
    return [inner for inner in inners if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW))]


@torch.no_grad()
def ensure_adam_state(optimizer) -> None:
    """CPU fix 1: give every parameter Adam state (step 0, zero moments) before building a sharded state dict.

    Megatron's DistributedOptimizer.state_dict() asserts one common `step` over torch Adam's per-param
    state, so it fails on an optimizer that has not stepped yet (a fresh one about to load a checkpoint,
    or a save before the first update); and a plain optimizer saved before its first update would have
    no moment tensors to load back. Zero moments at step 0 are exactly what Adam would create lazily, so
    this changes no update."""
    for inner in _torch_adams(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state[p]:
                    inner.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32),
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def optimizer_sharded_state_dict(optimizer, model_sharded_sd: dict, is_loading: bool) -> dict:
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject

    ensure_adam_state(optimizer)
    sharded = optimizer.sharded_state_dict(model_sharded_sd, is_loading=is_loading, metadata=dict(SHARDED_METADATA))
    for part in [sharded] if len(sub_optimizers(optimizer)) == 1 else sharded.values():
        if part.get("param_state", False) is None:  # DP ranks > 0 of the gloo gather: nothing to write;
            part["param_state"] = LocalNonpersistentObject(None)  # keeps the common state equal to DP rank 0's
    return sharded


def load_optimizer_state(optimizer, state) -> None:
    """Apply what dist_checkpointing.load returned for `optimizer_sharded_state_dict(..., is_loading=True)`."""
    subs = sub_optimizers(optimizer)
    parts = [state] if len(subs) == 1 else [state[i] for i in range(len(subs))]
    # CPU fix 2: the parameter-state loaders copy_ into fp32 main params, leaf tensors that require grad.
    with torch.no_grad():
        for sub, part in zip(subs, parts):
            if _is_distributed(sub):
                _load_distributed(sub, part)
            else:
                _default_common_step(sub, part)
                sub.load_state_dict(part)
    if len(subs) > 1:
        optimizer._synchronize_steps()
    _own_step_tensors(optimizer)


def _load_distributed(sub, part: dict) -> None:
    """DistributedOptimizer.load_state_dict, split in two so that torch Adam's `step` survives.

    With torch's Adam (no TE/apex on CPU) megatron's load_state_dict puts `step` into every param's state
    and then its parameter-state loader copies every state key from the checkpoint, where `step` is not
    (KeyError 'step'). So: load the non-tensor part (param groups + step), set `step` aside, load the
    model-space tensors, put `step` back (fix 3, together with `_own_step_tensors`)."""
    loaders = {"fully_reshardable": sub.load_parameter_state_from_fully_reshardable,
               "dp_reshardable": sub.load_parameter_state_from_dp_reshardable}
    part = dict(part)
    param_state = part.pop("param_state", None)
    sharding = part.pop("param_state_sharding_type", None)
    sub.load_state_dict(part)
    inner_state = sub.optimizer.state
    steps = {p: s.pop("step") for p, s in inner_state.items() if "step" in s}
    if param_state is not None:
        if sharding not in loaders:
            raise ValueError(f"distributed optimizer state in format {sharding!r}; this loader reads "
                             f"{', '.join(loaders)}.")
        loaders[sharding](param_state)
    for p, step in steps.items():
        inner_state[p]["step"] = step


def _default_common_step(sub, part: dict) -> None:
    """A plain optimizer saved before its first update has moments but no `common_step` (megatron writes it
    only when non-zero), and torch Adam refuses state without `step`: restore step 0 explicitly."""
    if not isinstance(getattr(sub, "optimizer", None), (torch.optim.Adam, torch.optim.AdamW)):
        return  # fused (TE/apex) Adam keeps its step in the param groups
    inner = part["optimizer"] if isinstance(part.get("optimizer"), dict) and "state" in part["optimizer"] else part
    state = inner.get("state")
    if isinstance(state, dict) and state and "common_step" not in state:
        state["common_step"] = torch.tensor(0.0, dtype=torch.float32)


def _own_step_tensors(optimizer) -> None:
    """CPU fix 3: one `step` tensor per parameter. Megatron restores a single shared step tensor for all
    params; torch Adam increments each param's `step` in place, so a shared tensor would advance once per
    parameter per update and break the bias correction (resume would no longer be exact)."""
    for inner in _torch_adams(optimizer):
        for per_param in inner.state.values():
            if per_param:
                step = per_param.get("step", torch.tensor(0.0, dtype=torch.float32))
                per_param["step"] = step.detach().clone()


def adam_steps(optimizer) -> set[float]:
    """The distinct step counts in the optimizer's state (one value after a consistent load)."""
    return {float(s["step"]) for inner in _torch_adams(optimizer) for s in inner.state.values() if "step" in s}
