"""Checkpoints: save / resume a training run (`save_load`), find what to resume from (`layout`), initialise a
model from converted weights (`model_weights`). Conversion to and from HF lives in `rlhf_mcore.convert`."""
from rlhf_mcore.checkpoint.layout import CheckpointError, find_latest, list_checkpoints, resolve_resume
from rlhf_mcore.checkpoint.model_weights import HEAD_KEYS, load_model_weights
from rlhf_mcore.checkpoint.save_load import load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "HEAD_KEYS", "find_latest", "list_checkpoints", "load_checkpoint",
           "load_model_weights", "resolve_resume", "save_checkpoint"]
