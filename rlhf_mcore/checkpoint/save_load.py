"""Save and resume a training run: one megatron dist-checkpoint per role (model + optimizer), the RNG states
of every rank and the trainer's JSON state, published atomically (layout: `rlhf_mcore.checkpoint.layout`).

Collective: every rank calls `save_checkpoint` / `load_checkpoint` with the same arguments.
Across layouts (a different TP/PP/DP at load time) megatron reshards model weights and optimizer state
(see `optim_state` for the formats); RNG states are restored only at the layout they were saved at.
A LoRA role (`models.lora`) saves its trainable parameters only (adapters; a critic's head) with their optimizer
state, and records its LoRA settings: a resume with other settings is refused. Its base comes from
model.hf_path / model.load at start, as in the first run.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.checkpoint.architecture import architecture_mismatch, architecture_of
from rlhf_mcore.checkpoint.keys import OPTIMIZER_PREFIX, apply_model_state, check_keys
from rlhf_mcore.checkpoint.layout import (
    FORMAT,
    META_FILE,
    RNG_DIR,
    TRAINER_STATE_FILE,
    CheckpointError,
    atomic_write_text,
    prune,
    read_meta,
    remove_orphans,
    step_dir,
    tmp_dir_for,
    write_latest,
)
from rlhf_mcore.checkpoint.optim_state import load_optimizer_state, optimizer_kind, optimizer_sharded_state_dict
from rlhf_mcore.checkpoint.rng import load_rng_file, save_rng_file
from rlhf_mcore.checkpoint.verify import checkpoint_problems, record_checksums, verify_checkpoint
from rlhf_mcore.checkpoint.writers import watch_writers
from rlhf_mcore.disk import disk_full_message, publish_dir
from rlhf_mcore.models.lora import checkpointed_state

log = logging.getLogger(__name__)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _layout(ctx) -> dict:
    d = ctx.dims
    return {"tp": d.tp, "pp": d.pp, "dp": d.dp, "world_size": d.world_size}


class NonFiniteWeightsError(CheckpointError):
    """The weights to save hold inf or nan: such a checkpoint is never written."""


class DiskFullError(CheckpointError):
    """A save failed because the disk is full."""


def _rng_file(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


def _everywhere(what: str, fn, ctx, where=None) -> None:
    """Run a local step on every rank and agree on the outcome, so that a failure on one rank raises on all
    of them (instead of leaving the others waiting in the next collective)."""
    error = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - re-raised below with context
        error = e
    failed = torch.tensor([0.0 if error is None else 1.0], device=ctx.device)
    if dist.is_initialized():
        dist.all_reduce(failed)
    if error is not None:
        detail = disk_full_message(error, where) if where else None
        raise (DiskFullError if detail else CheckpointError)(
            f"checkpoint: {what} failed on rank {_rank()}: {detail or f'{type(error).__name__}: {error}'}") from error
    if failed.item():
        raise CheckpointError(f"checkpoint: {what} failed on {int(failed.item())} other rank(s); see their logs.")


def _check_roles(states: dict, frozen: dict) -> None:
    both = set(states) & set(frozen)
    if both:
        raise CheckpointError(f"checkpoint: role(s) {sorted(both)} given both as trainable and as frozen.")
    for role in (*states, *frozen):
        if not role or "/" in role or role.startswith(".") or role == RNG_DIR:
            raise CheckpointError(f"checkpoint: role name {role!r} cannot be a directory name. Use e.g. 'actor'.")


def _shared_tmp(final: Path) -> Path:
    name = [tmp_dir_for(final).name]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return final.with_name(name[0])


def _save_role(role_dir: Path, model, optimizer) -> dict:
    from megatron.core import dist_checkpointing

    model_sd, _ = checkpointed_state(model)
    sharded = {"model": model_sd}
    if optimizer is not None:
        sharded["optimizer"] = optimizer_sharded_state_dict(optimizer, model_sd, is_loading=False)
    with watch_writers(role_dir):  # a writer that dies would hang the save forever (checkpoint/writers.py)
        dist_checkpointing.save(sharded, str(role_dir))
    if _rank() == 0:  # a vision LM's tower, whole (the same on every rank), for the HF export: vision.safetensors
        from rlhf_mcore.models.vision import save_tower

        save_tower(role_dir, model)
    role = {"trainable": optimizer is not None, "architecture": architecture_of(model),
            "optimizer": optimizer_kind(optimizer) if optimizer is not None else None}
    return {**role, "lora": _lora_of(model)} if _lora_of(model) else role


def _lora_of(model) -> dict | None:
    settings = getattr(model, "lora_settings", None)
    return settings.describe() if settings is not None else None


def check_architecture(path: Path, saved: dict | None, role: str, model) -> None:
    """One line naming every field in which the saved role's architecture differs from `model`'s."""
    diffs = architecture_mismatch(saved, architecture_of(model))
    if diffs:
        raise CheckpointError(
            f"{path}: role {role!r} was saved from another architecture ({'; '.join(diffs)}); its weights would load "
            "into the wrong places. Use the saved model settings, or start over with trainer.resume=restart.")


def _check_lora(path: Path, meta: dict, role: str, model) -> None:
    saved, now = meta["roles"][role].get("lora"), _lora_of(model)
    if saved != now:
        raise CheckpointError(
            f"{path}: role {role!r} was saved with LoRA {saved or 'off'} and this run has LoRA {now or 'off'}; "
            "the checkpoint holds " + ("adapters only" if saved else "full weights") + ". Resume with the saved "
            "model.lora_* / critic.lora_rank, or start over with trainer.resume=restart.")


def _publish(tmp: Path, final: Path) -> None:
    """Rank 0, once every rank has finished writing: rename into place (`latest` moves once it verifies). The
    same step saved again (e.g. a re-run) is replaced; it waits as a `.tmp-` sibling (an orphan if killed)."""
    publish_dir(tmp, final, aside=tmp_dir_for(final))


def _check_finite(states: dict, frozen: dict, ctx) -> None:
    """Collective: raise NonFiniteWeightsError on every rank when any rank holds a non-finite weight."""
    models = {**{role: s.module for role, s in states.items()}, **frozen}
    bad = [role for role, model in models.items()
           if not torch.stack([p.detach().isfinite().all() for p in model.parameters()]).all()]
    flags = torch.tensor([float(role in bad) for role in models], device=ctx.device)
    if dist.is_initialized():
        dist.all_reduce(flags)
    bad = [role for role, flag in zip(models, flags.tolist()) if flag]
    if bad:
        raise NonFiniteWeightsError(f"checkpoint: not saved: the weights of {', '.join(bad)} hold inf or nan. "
                                    "The previous checkpoints are kept; resume from the newest of them.")


def _retire_old(final: Path, step: int, keep: int | None) -> None:
    """Rank 0, once `final` verifies: point `latest` at it, then delete what it replaces."""
    write_latest(final.parent, step)
    if keep is not None:
        prune(final.parent, keep, newest=final)
    remove_orphans(final.parent)


def save_checkpoint(run_dir, step: int, states: dict, extra: dict | None, ctx, *, frozen: dict | None = None,
                    keep: int | None = None, run_id: str | None = None) -> str:
    """Write `run_dir/global_step_{step}` atomically and return its path.

    states: role -> TrainState (model + optimizer); frozen: role -> GPTModel saved without optimizer (only
    models that change during training); extra: JSON-able trainer state, returned by load_checkpoint;
    keep: trainer.max_checkpoints_to_keep (None keeps every checkpoint); pruning deletes only older checkpoints
    of the same run_id (recorded in checkpoint.json; `rlhf_mcore.checkpoint.run_identity`)."""
    start = time.perf_counter()
    frozen = frozen or {}
    _check_roles(states, frozen)
    try:
        extra_text = json.dumps({} if extra is None else extra, indent=2, sort_keys=True, allow_nan=True)
    except TypeError as e:
        raise CheckpointError(f"checkpoint: extra (trainer state) must be JSON-serialisable: {e}.") from e
    _check_finite(states, frozen, ctx)
    run_dir = Path(run_dir).resolve()
    final = step_dir(run_dir, step)
    tmp = _shared_tmp(final)
    rank0 = _rank() == 0

    def prepare():
        if rank0:
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_orphans(run_dir)
            for sub in (*states, *frozen, RNG_DIR):
                (tmp / sub).mkdir(parents=True)

    _everywhere(f"creating {tmp}", prepare, ctx, where=run_dir)
    try:
        roles = _save_roles(tmp, states, frozen, ctx)
        _everywhere("writing RNG states", lambda: save_rng_file(tmp / RNG_DIR / _rng_file(_rank())), ctx, where=tmp)
        _everywhere("writing the trainer state",
                    lambda: rank0 and (tmp / TRAINER_STATE_FILE).write_text(extra_text + "\n"), ctx, where=tmp)
        meta = {"format": FORMAT, "step": step, "roles": roles, "layout": _layout(ctx), "files": record_checksums(tmp),
                "megatron_core": _megatron_version(), "run_id": run_id, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S")}

        def finish():
            if rank0:
                atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=2, sort_keys=True) + "\n")
                _publish(tmp, final)

        _everywhere(f"publishing {final}", finish, ctx, where=tmp)
    except CheckpointError:
        if rank0:  # raised on every rank together (see _everywhere): nobody writes to tmp any more
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    problems = checkpoint_problems(final)  # read back; old checkpoints go only once the new one verifies
    if problems:
        raise CheckpointError(f"checkpoint: {final} was written but does not verify ({problems[0]}); older "
                              "checkpoints are kept.")
    _everywhere("removing old checkpoints", lambda: rank0 and _retire_old(final, step, keep), ctx)
    log.info("saved checkpoint %s (%s) in %.2fs", final, ", ".join(roles), time.perf_counter() - start)
    return str(final)


def _save_roles(tmp: Path, states: dict, frozen: dict, ctx) -> dict:
    try:
        roles = {role: _save_role(tmp / role, s.module, s.optimizer) for role, s in states.items()}
        roles.update({role: _save_role(tmp / role, model, None) for role, model in frozen.items()})
    except BaseException as e:  # a full disk surfaces here in torch's words (CheckpointException: BaseException)
        detail = None if isinstance(e, (KeyboardInterrupt, SystemExit)) else disk_full_message(e, tmp)
        if detail is None:
            raise
        raise DiskFullError(f"checkpoint: writing {tmp} failed on rank {_rank()}: {detail}") from e
    return roles


def _megatron_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return "unknown"


def _check_role_meta(path: Path, meta: dict, role: str, want_optimizer) -> None:
    saved = meta["roles"].get(role)
    if saved is None:
        raise CheckpointError(
            f"{path}: no role {role!r} in this checkpoint (it holds: {', '.join(sorted(meta['roles']))}). Resume "
            "with the roles it was saved with (algorithm.adv_estimator decides whether there is a critic) or "
            "start over with trainer.resume=restart.")
    if want_optimizer is None:
        return
    if not saved["trainable"]:
        raise CheckpointError(f"{path}: role {role!r} was saved without optimizer state (as frozen); it cannot "
                              "resume training. Load it with load_optimizer=False.")
    kind = optimizer_kind(want_optimizer)
    if saved["optimizer"] != kind:
        raise CheckpointError(
            f"{path}: role {role!r} was saved with a {saved['optimizer']} and this run uses a {kind}; optimizer "
            "state does not convert between the two. Set parallel.use_distributed_optimizer as in the saved run "
            f"({'true' if 'Distributed' in saved['optimizer'] else 'false'}), or load weights only.")


def _load_role(role_dir: Path, role: str, model, optimizer) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException

    model_sd, left_out = checkpointed_state(model)
    sharded = {"model": model_sd}
    if optimizer is not None:
        sharded["optimizer"] = optimizer_sharded_state_dict(optimizer, model_sd, is_loading=True)
    ignore = () if optimizer is not None else (OPTIMIZER_PREFIX,)
    check_keys(sharded, str(role_dir), f"role {role!r}", ignore_prefixes=ignore)
    try:
        state = dist_checkpointing.load(sharded, str(role_dir))
    except CheckpointingException as e:
        raise CheckpointError(f"{role_dir}: loading role {role!r} failed: {e}") from e
    apply_model_state(model, state["model"], str(role_dir), left_out)
    if optimizer is not None:
        load_optimizer_state(optimizer, state["optimizer"])


def load_checkpoint(path, states: dict, ctx, *, frozen: dict | None = None, load_optimizer: bool = True,
                    load_rng: bool = True, verify: bool = True) -> dict:
    """Restore the roles in `states` (model + optimizer) and `frozen` (model only) from a checkpoint written
    by save_checkpoint, and the RNG states when the layout is the one it was saved at. Returns `extra`.
    verify: check every file against the checksums recorded at save first (False: the caller just did)."""
    start = time.perf_counter()
    path = Path(path)
    frozen = frozen or {}
    _check_roles(states, frozen)
    if verify:
        verify_checkpoint(path)
    meta = read_meta(path)
    for role, s in states.items():
        _check_role_meta(path, meta, role, s.optimizer if load_optimizer else None)
        check_architecture(path, meta["roles"][role].get("architecture"), role, s.module)
        _check_lora(path, meta, role, s.module)
    for role, model in frozen.items():
        _check_role_meta(path, meta, role, None)
        check_architecture(path, meta["roles"][role].get("architecture"), role, model)
    unused = sorted(set(meta["roles"]) - set(states) - set(frozen))
    if unused:
        log.warning("%s: role(s) %s in the checkpoint are not loaded", path, ", ".join(unused))
    for role, s in states.items():
        _load_role(path / role, role, s.module, s.optimizer if load_optimizer else None)
    for role, model in frozen.items():
        _load_role(path / role, role, model, None)
    same_layout = meta["layout"] == _layout(ctx)
    if load_rng and same_layout:
        _everywhere("restoring RNG states", lambda: load_rng_file(path / RNG_DIR / _rng_file(_rank())), ctx)
    elif load_rng and _rank() == 0:
        log.warning("%s: saved at %s, loaded at %s: RNG states are not restored (they are per rank); the "
                    "run continues from the seeded RNGs.", path, meta["layout"], _layout(ctx))
    extra = json.loads((path / TRAINER_STATE_FILE).read_text())
    if _rank() == 0:
        remove_orphans(path.parent)
    _barrier()
    log.info("loaded checkpoint %s (%s) in %.2fs", path, ", ".join([*states, *frozen]), time.perf_counter() - start)
    return extra
