"""Wrap a trainable model for training: megatron DDP, megatron's optimizer, and the learning-rate schedule.

Losses use megatron's per-token path (`calculate_per_token_loss`): each micro-batch returns
(loss_sum, count); `finalize_model_grads` all-reduces the counts over DP and divides the gradients, so
the update is the exact global mean however the batch is split across micro-batches and ranks.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch

from rlhf_mcore.logs import log_once

log = logging.getLogger("rlhf_mcore")


@dataclasses.dataclass
class TrainState:
    """One trainable role (actor or critic): the DDP-wrapped chunks and their optimizer."""

    model: list  # [DistributedDataParallel] (one chunk per rank; a list for megatron's schedules)
    optimizer: object  # megatron MegatronOptimizer
    optim_cfg: object  # rlhf_mcore.config.OptimConfig

    @property
    def module(self):
        """The unwrapped GPTModel."""
        return self.model[0].module


def lr_at(step: int, optim_cfg, total_steps: int) -> float:
    """Linear warm-up, then constant or cosine decay to min_lr_ratio * lr.

    >>> from rlhf_mcore.config.schema import OptimConfig
    >>> c = OptimConfig(lr=1.0, lr_warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.0)
    >>> [round(lr_at(s, c, 6), 3) for s in range(6)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
    """
    base = optim_cfg.lr
    if step < optim_cfg.lr_warmup_steps:
        return base * (step + 1) / optim_cfg.lr_warmup_steps
    if optim_cfg.lr_schedule == "constant" or total_steps <= optim_cfg.lr_warmup_steps:
        return base
    progress = (step - optim_cfg.lr_warmup_steps) / max(1, total_steps - optim_cfg.lr_warmup_steps)
    floor = base * optim_cfg.min_lr_ratio
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_train_state(model, optim_cfg, parallel_cfg) -> TrainState:
    """DDP-wrap `model` (a GPTModel) and build megatron's Adam(W) for it."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from rlhf_mcore.apex_free import apply_apex_free_patches, fuse_torch_adam

    apply_apex_free_patches()  # GPU without apex/TE: megatron's per-tensor optimizer fallbacks -> foreach kernels
    tc = model.config
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=parallel_cfg.use_distributed_optimizer,
    )
    ddp = DistributedDataParallel(config=tc, ddp_config=ddp_cfg, module=model)
    opt_cfg = OptimizerConfig(
        optimizer="adam",
        lr=optim_cfg.lr,
        weight_decay=optim_cfg.weight_decay,
        adam_beta1=optim_cfg.adam_beta1,
        adam_beta2=optim_cfg.adam_beta2,
        adam_eps=optim_cfg.adam_eps,
        clip_grad=optim_cfg.grad_clip,
        bf16=tc.bf16,
        params_dtype=tc.params_dtype,
        use_distributed_optimizer=parallel_cfg.use_distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [ddp])
    if fuse_torch_adam(optimizer):
        log_once(log, "fused torch adamw", "optimizer: torch AdamW with fused=True (apex and TE absent; "
                 "rlhf_mcore/apex_free.py)")
    # The schedule calls these: no grad sync between micro-batches, then one reduction and the
    # division by the global token count at the end.
    tc.no_sync_func = ddp.no_sync
    tc.finalize_model_grads_func = finalize_model_grads
    tc.grad_scale_func = optimizer.scale_loss
    return TrainState(model=[ddp], optimizer=optimizer, optim_cfg=optim_cfg)


def optimizer_step(state: TrainState, lr: float) -> tuple[bool, float]:
    """(applied, grad_norm) after the gradients of one mini-batch are accumulated and finalised.

    Megatron's `step()` split in its parts so that a non-finite grad norm (a non-finite loss gives one) skips
    the update: no weight and no Adam state changes. The norm is megatron's own, reduced over the model-parallel
    group and read on the host once, as `step()` does: the check adds no host sync, and every rank decides alike."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    opt = state.optimizer
    set_lr(opt, lr)
    found_inf = opt.prepare_grads()  # main grads ready; True only for fp16 loss scaling overflows
    grad_norm = float(opt.get_grad_norm())
    if found_inf or not math.isfinite(grad_norm):
        return False, grad_norm
    if state.optim_cfg.grad_clip > 0:
        for inner in getattr(opt, "chained_optimizers", [opt]):
            params = inner.get_parameters()
            if params:
                clip_grad_by_total_norm_fp32(params, state.optim_cfg.grad_clip, grad_norm,
                                             inner.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)
    return bool(opt.step_with_ready_grads()), grad_norm


def zero_grads(state: TrainState) -> None:
    for chunk in state.model:
        chunk.zero_grad_buffer()
    state.optimizer.zero_grad()


def _move_optimizer_states(state: TrainState, device: torch.device) -> None:
    for opt in getattr(state.optimizer, "chained_optimizers", [state.optimizer]):
        inner = getattr(opt, "optimizer", opt)
        for per_param in inner.state.values():
            for key, value in per_param.items():
                if torch.is_tensor(value) and value.dim() > 0:
                    per_param[key] = value.to(device, non_blocking=True)


def offload_for_rollout(state: TrainState) -> None:
    """trainer.offload_during_rollout: Adam states to host memory and grad buffers freed (GPU only)."""
    _move_optimizer_states(state, torch.device("cpu"))
    for chunk in state.model:
        chunk.offload_grad_buffers()


def reload_after_rollout(state: TrainState, device) -> None:
    for chunk in state.model:
        chunk.restore_grad_buffers()
    _move_optimizer_states(state, torch.device(device))
