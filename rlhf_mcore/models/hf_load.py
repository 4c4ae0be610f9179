"""Load an HF checkpoint directory straight into this rank's shard of a megatron model (any TP/PP layout).

Each rank opens the safetensors files lazily and reads only what its parameters hold: the tensors of its
pipeline stage, and of those only its TP slice (safetensors `get_slice`), fused as the weight-map table
says (`models.weights`). The result is bitwise what `tools.convert_checkpoint hf-to-mcore` followed by a
megatron load gives: the same rows of the same tensors, copied into the same parameters.

`weight_source(model_cfg)` is the start-up rule for the actor's initial weights (`model.init`):
model.load when set, else hf_path's weights, else random only when asked (model.init=random) or when the
architecture is written inline (tiny test models).
"""
from __future__ import annotations

import os

import torch

from rlhf_mcore.models.full_weights import global_key, merged_linears, partition_dim
from rlhf_mcore.models.hf_io import LazyStateDict, check_weight_files, weight_files
from rlhf_mcore.models.roles import role_spec

# models.weights (the weight-map tables) is imported inside the functions: keeps the trainer's import chain short

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"


def has_hf_weights(hf_dir: str) -> bool:
    """The directory holds weight files (safetensors, their index, or a torch .bin)."""
    try:
        weight_files(hf_dir)
    except ValueError:
        return False
    return True


def weight_source(model_cfg) -> tuple[str, str]:
    """('load' | 'hf' | 'random', where from) for the actor's initial weights; raises on a run that would
    start from random weights without saying so."""
    if model_cfg.load:
        return "load", model_cfg.load
    if model_cfg.init == "random":
        return "random", "model.init=random"
    if model_cfg.hf_path:
        if not has_hf_weights(model_cfg.hf_path):
            raise ValueError(f"model.init: auto found no weights in model.hf_path (got {model_cfg.hf_path!r}; "
                             "looked for model.safetensors[.index.json], pytorch_model.bin). Add the HF weights "
                             "there, set model.load to a megatron checkpoint, or set model.init=random.")
        check_weight_files(model_cfg.hf_path)  # a damaged shard is named before the model is built
        return "hf", model_cfg.hf_path
    return "random", "inline architecture (no model.hf_path)"


def _check_names(sd: LazyStateDict, hf_config: dict, role: str, rules: list, source: str) -> None:
    from rlhf_mcore.models.registry import spec_for_hf_config
    from rlhf_mcore.models.weights import _check_leftovers

    used = {key for rule in rules for key in rule.hf}
    vision = spec_for_hf_config(hf_config, source).vision_prefix  # the vision tower's tensors: models.vision's
    used |= {key for key in sd if vision and key.startswith(vision)}
    if not role_spec(role).lm_head or hf_config.get("tie_word_embeddings"):
        used.add("lm_head.weight")  # a scalar head model has no LM head; a tied one may store a copy
    _check_leftovers(set(sd) - used, source, "HF")


def _read(sd: LazyStateDict, key: str, expected: tuple[int, ...], mcore_key: str, source: str,
          dim: int = -1, part: tuple[int, int] = (0, 1)) -> torch.Tensor | None:
    """Part `part[0]` of `part[1]` equal parts of tensor `key` along `dim` (-1: all of it; 0 parts: only
    check the shape)."""
    if key not in sd:
        hint = " A reward model needs a *ForSequenceClassification checkpoint." if "score" in key else ""
        raise ValueError(f"{source}: missing tensor '{key}' (for megatron '{mcore_key}').{hint}")
    if sd.shape(key) != expected:
        raise ValueError(f"{source}: tensor '{key}' has shape {list(sd.shape(key))}, expected {list(expected)} "
                         "from the config.")
    if part[1] == 0:
        return None
    if dim < 0 or part[1] == 1:
        return sd[key]
    size = expected[dim] // part[1]
    return sd.read_slice(key, dim, part[0] * size, (part[0] + 1) * size)


def _vocab_rows(sd, key, expected, mcore_key, source, rows: int, start: int) -> torch.Tensor:
    """Rows [start, start + rows) of the vocab-padded tensor: real rows read, padding rows zero."""
    _read(sd, key, expected, mcore_key, source, dim=0, part=(0, 0))  # checks the shape, reads nothing
    real = max(0, min(rows, expected[0] - start))
    head = sd.read_slice(key, 0, start, start + real) if real else sd.read_slice(key, 0, 0, 1)[:0]
    pad = rows - real
    return torch.cat([head, head.new_zeros(pad, *expected[1:])]) if pad else head


def read_shard(sd: LazyStateDict, rule, dims: dict, param, tp_rank: int, tp_size: int,
               source: str) -> torch.Tensor:
    """This TP rank's part of the megatron tensor `rule.mcore`, reading only its rows / columns."""
    from rlhf_mcore.models.weights import _shape

    dim = partition_dim(param, rule.mcore)
    split = tp_size if dim >= 0 else 1
    rank = tp_rank if dim >= 0 else 0
    shapes = [_shape(s, dims) for s in rule.shapes]
    if rule.fuse == "vocab":
        rows = param.shape[0]
        return _vocab_rows(sd, rule.hf[0], shapes[0], rule.mcore, source, rows, rank * rows)
    if rule.fuse == "copy":
        return _read(sd, rule.hf[0], shapes[0], rule.mcore, source, dim, (rank, split))
    if dim not in (0, -1):
        raise ValueError(f"{source}: '{rule.mcore}' is split over TP along dim {dim}; fused rows expected.")
    if rule.fuse == "gate_up":
        return torch.cat([_read(sd, k, s, rule.mcore, source, 0, (rank, split)) for k, s in zip(rule.hf, shapes)])
    groups = dims["groups"] // split  # qkv: whole query groups per TP rank, [q heads; k; v] per group
    parts = [_read(sd, k, s, rule.mcore, source, 0, (rank, split)) for k, s in zip(rule.hf, shapes)]
    rest = parts[0].shape[1:]
    return torch.cat([t.reshape(groups, -1, *rest) for t in parts], dim=1).reshape(-1, *rest)


@torch.no_grad()
def load_hf_weights(model, hf_dir: str, hf_config: dict, tp_rank: int, tp_size: int) -> str:
    """Copy an HF checkpoint's weights into this rank's shard of `model` (role from `model.role`); a critic
    without a value head in the checkpoint keeps its own. Returns a description of the source for the log."""
    from rlhf_mcore.models.registry import spec_for_hf_config
    from rlhf_mcore.models.weights import SCORE_HEAD, model_dims, rules_for

    files = weight_files(hf_dir)
    source = str(files[0]) if len(files) == 1 else os.path.join(hf_dir, "model.safetensors.index.json")
    spec = spec_for_hf_config(hf_config, source)
    hf_config = spec.text_config(hf_config)  # a vision-language config.json nests the LM's fields
    sd = LazyStateDict(files, spec.checkpoint_aliases)
    role = model.role
    dims = model_dims(hf_config, source)
    rules = rules_for(hf_config, role, source)
    _check_names(sd, hf_config, role, rules, source)
    by_key = {rule.mcore: rule for rule in rules}
    tied = getattr(model, "share_embeddings_and_output_weights", False)
    fresh = role_spec(role).fresh_head
    adapters, _ = merged_linears(model)  # LoRA adapters are not in an HF checkpoint (model.lora_adapter_path)
    for key, param in model.named_parameters():
        if key in adapters:
            continue
        full_key = global_key(model, key)
        if tied and full_key == OUTPUT:
            full_key = EMBEDDING  # a last stage's copy of the tied embedding
        rule = by_key.get(full_key)
        if full_key == OUTPUT and fresh and (rule is None or (rule is SCORE_HEAD and "score.weight" not in sd)):
            continue  # a critic from a causal LM: the value head keeps its initialisation
        if rule is None:
            raise ValueError(f"{source}: no tensor maps to model parameter '{key}' ('{full_key}').")
        part = read_shard(sd, rule, dims, param, tp_rank, tp_size, source)
        if tuple(part.shape) != tuple(param.shape):
            raise ValueError(f"{source}: tensor(s) {', '.join(rule.hf)} give shape {list(part.shape)} on TP rank "
                             f"{tp_rank}/{tp_size}, but '{key}' has {list(param.shape)}.")
        param.copy_(part)
    return f"{source} ({len(files)} file(s), read lazily: this rank's tensors and TP slice only)"
