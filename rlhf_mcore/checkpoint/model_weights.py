"""Initialise one model from a plain dist-checkpoint of its weights: what `tools/convert_checkpoint.py
hf-to-mcore` writes (`dist_checkpointing.save(model.sharded_state_dict(), dir)` plus hf/), or one role
directory of a training checkpoint (`global_step_N/actor`: same tensor keys, optimizer keys ignored).
Megatron reshards, so the checkpoint may come from any TP/PP layout. A LoRA model loads its base here (its
adapters keep their initialisation: they are not in a base checkpoint)."""
from __future__ import annotations

import logging
from pathlib import Path

from rlhf_mcore.checkpoint.architecture import architecture_mismatch, architecture_of, saved_architecture
from rlhf_mcore.checkpoint.keys import OPTIMIZER_PREFIX, apply_model_state, check_keys, drop_keys
from rlhf_mcore.checkpoint.layout import META_FILE, CheckpointError
from rlhf_mcore.models.lora import base_state
from rlhf_mcore.models.roles import ROLES

log = logging.getLogger(__name__)

# The output layer: the LM head [V, h] of actor/ref checkpoints, the value/score head [1, h] of critic/reward.
HEAD_KEYS = ("output_layer.weight",)
# a role with a fresh head (the critic) may start from an actor (LM) checkpoint: its head keeps its init
_ROLE_DEFAULTS = {name: HEAD_KEYS for name, spec in ROLES.items() if spec.fresh_head}


def _check_dir(path: Path) -> None:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory. Pass a dist-checkpoint written by "
                              "tools/convert_checkpoint.py hf-to-mcore, or a global_step_N/<role> directory.")
    if (path / META_FILE).is_file():
        roles = sorted(p.name for p in path.iterdir() if (p / "metadata.json").is_file())
        raise CheckpointError(f"{path}: a training checkpoint, not one model's weights. Pass one of its role "
                              f"directories: {', '.join(str(path / r) for r in roles)}.")
    if not (path / "metadata.json").is_file():
        raise CheckpointError(f"{path}: no metadata.json: not a megatron dist-checkpoint. Convert an HF model "
                              "with `python -m tools.convert_checkpoint hf-to-mcore --hf-dir D --out O`.")


def load_model_weights(model, path, allow_missing=None) -> list[str]:
    """Load `model`'s weights from `path` (collective). Keys in `allow_missing` that the checkpoint lacks or
    holds with another shape keep their initialisation and are returned; any other mismatch raises and names
    its keys. allow_missing=None means HEAD_KEYS for a critic (role attribute set by build_model), else none.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException

    path = Path(path)
    _check_dir(path)
    role = getattr(model, "role", None)
    diffs = architecture_mismatch(saved_architecture(path, META_FILE), architecture_of(model))
    if diffs:
        raise CheckpointError(f"{path}: saved from another architecture than this {role or 'model'} "
                              f"({'; '.join(diffs)}); its weights would load into the wrong places. Build the "
                              "model as the checkpoint was saved (model.* settings), or load another checkpoint.")
    if allow_missing is None:
        allow_missing = _ROLE_DEFAULTS.get(role, ())
    sharded, adapters = base_state(model)
    what = f"model{f' ({role})' if role else ''}"
    skipped = check_keys(sharded, str(path), what, allow_missing=allow_missing, ignore_prefixes=(OPTIMIZER_PREFIX,))
    kept = drop_keys(sharded, skipped)
    try:
        state = dist_checkpointing.load(kept, str(path))
    except CheckpointingException as e:
        raise CheckpointError(f"{path}: loading {what} failed: {e}") from e
    state = {name: v for name, v in state.items() if name in kept}  # drop a training checkpoint's common state
    skipped_names = [name for name, v in sharded.items() if getattr(v, "key", None) in skipped]
    apply_model_state(model, state, str(path), [*skipped_names, *adapters])
    if skipped:
        log.warning("%s: kept the initial %s of the %s (absent or shaped differently in the checkpoint)",
                    path, ", ".join(sorted(skipped)), role or "model")
    return sorted(skipped)
