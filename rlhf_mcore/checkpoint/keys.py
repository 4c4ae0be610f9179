"""Compare what a model (and its optimizer) asks to load with what a dist-checkpoint holds, before loading,
so that a mismatch names its keys and shapes instead of surfacing as a deep megatron/torch error."""
from __future__ import annotations

import torch.distributed as dist

from rlhf_mcore.checkpoint.layout import CheckpointError

OPTIMIZER_PREFIX = "optimizer."
SHOW = 8  # keys named per error line


def requested_shapes(sharded_sd) -> dict[str, tuple[int, ...]]:
    """Global key -> global shape of every tensor in a sharded state dict (factories built)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    shapes = {}
    for value in nested_values(sharded_sd):
        parts = nested_values(value.build()) if isinstance(value, ShardedTensorFactory) else [value]
        for part in parts:
            if isinstance(part, ShardedTensor):
                shapes[part.key] = tuple(part.global_shape)
    return shapes


def checkpoint_shapes(ckpt_dir: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's global shape, read from the metadata after safe_load.check_loadable (no code runs)."""
    from megatron.core import dist_checkpointing

    from rlhf_mcore.checkpoint.safe_load import check_loadable

    check_loadable(ckpt_dir)  # first reader of every load path (check_keys): a refusal is one line
    try:
        metadata = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
    except Exception as e:  # noqa: BLE001 - megatron raises several types for a non-checkpoint
        raise CheckpointError(f"{ckpt_dir}: not a readable megatron dist-checkpoint ({type(e).__name__}: {e}).") from e
    return {key: tuple(t.global_shape) for key, t in metadata.items()}


def _union_over_ranks(keys: set[str]) -> set[str]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return keys
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(keys))
    return set().union(*map(set, gathered))


def _names(keys) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - SHOW} more)" if len(keys) > SHOW else ""
    return ", ".join(keys[:SHOW]) + more


def check_keys(sharded_sd, ckpt_dir: str, what: str, allow_missing=(), ignore_prefixes=()) -> set[str]:
    """Raise one CheckpointError listing every mismatch; return the keys in `allow_missing` that are absent
    from the checkpoint or differ in shape (the caller leaves those as initialised). Collective: every rank
    calls it (the unexpected-key check needs the keys requested by all pipeline stages)."""
    wanted = requested_shapes(sharded_sd)
    stored = checkpoint_shapes(ckpt_dir)
    allowed = set(allow_missing)
    absent = {k for k in wanted if k not in stored}
    reshaped = {k for k in wanted if k in stored and stored[k] != wanted[k]}
    skipped = (absent | reshaped) & allowed
    absent, reshaped = absent - allowed, reshaped - allowed
    requested_anywhere = _union_over_ranks(set(wanted))
    extra = {k for k in stored if k not in requested_anywhere and k not in allowed
             and not k.startswith(tuple(ignore_prefixes))}
    problems = []
    if absent:
        problems.append(f"missing from the checkpoint: {_names(absent)}")
    if reshaped:
        problems.append("shape mismatch (checkpoint vs model): " + "; ".join(
            f"{k} {list(stored[k])} vs {list(wanted[k])}" for k in sorted(reshaped)[:SHOW]))
    if extra:
        problems.append(f"in the checkpoint but not in the model: {_names(extra)}")
    if problems:
        raise CheckpointError(f"{ckpt_dir}: {what} does not match the checkpoint: " + " | ".join(problems)
                              + ". Build the model with the architecture it was saved with"
                              + (" (or list head keys in allow_missing)." if what.startswith("model") else "."))
    return skipped


def drop_keys(sharded_sd: dict, keys: set[str]) -> dict:
    """The top-level entries of a model's flat sharded state dict whose global key is not in `keys`."""
    return {name: v for name, v in sharded_sd.items() if getattr(v, "key", None) not in keys}


def apply_model_state(model, state: dict, source: str, skipped_names=()) -> None:
    """model.load_state_dict of what dist_checkpointing.load returned; megatron's `_extra_state` entries and
    the deliberately skipped names may be absent, nothing else."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("._extra_state") and k not in skipped_names]
    if missing or unexpected:
        raise CheckpointError(f"{source}: loaded state does not fit the model: missing {missing[:SHOW]}, "
                              f"unexpected {unexpected[:SHOW]}.")
