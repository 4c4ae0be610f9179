"""Who holds the accelerator's memory when: the rollout engine while it generates, training otherwise.

One place owns the whole lifecycle: `rollout_memory(run)` offloads the training state (optimizer states, grad
buffers; `trainer.offload_during_rollout`, GPU only) for the generation inside the `with` block, then releases
the engine's memory and reloads the training state; `sync_weights(run)` resumes the engine and sends it the
actor's new weights before the next rollout.
"""
from __future__ import annotations

import contextlib

import torch

from rlhf_mcore.logs import end_phase_peak, note_device_used, restart_phase_peak
from rlhf_mcore.trainer.optim import offload_for_rollout, reload_after_rollout


def offload_during(run, offload: bool) -> None:
    """Free training memory (optimizer states, grad buffers) for the rollout when configured (GPU only)."""
    if run.cfg.trainer.offload_during_rollout and torch.cuda.is_available():
        for state in run.roles.trainable().values():
            offload_for_rollout(state) if offload else reload_after_rollout(state, run.ctx.device)
        if offload:
            restart_phase_peak()  # perf/max_memory_gb/gen: the generation's peak, as the memory plan's rollout


@contextlib.contextmanager
def rollout_memory(run):
    """Generation inside the block: training state offloaded before, engine memory released after."""
    offload_during(run, True)
    try:
        yield run.engine
    finally:
        note_device_used("gen")  # perf/device_used_gb/gen: the engine's memory before it goes (timer "gen")
        end_phase_peak("gen")  # perf/max_memory_gb/gen: the generation's, without the reload below
        run.engine.release_memory()
        offload_during(run, False)


def sync_weights(run) -> dict[str, float]:
    """Give the engine its memory back and the actor's current weights (before the next generate); the
    engine's own metrics of the refresh (bytes moved; none for an engine that shares the actor's weights)."""
    run.engine.resume_memory()
    return run.engine.update_weights(run.roles.actor.model[0]) or {}
