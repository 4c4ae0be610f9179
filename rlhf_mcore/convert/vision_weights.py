"""The vision tower's tensors in converted checkpoints and HF exports (Qwen2.5-VL: `visual.*`).

The tower is a plain frozen torch module, whole on every rank (`models.vision`): none of it is TP- or PP-sharded,
so a converted checkpoint keeps it as a side file beside the megatron dist-checkpoint, not inside it:

    out/vision.safetensors   the tower's tensors under their HF names (`visual.*`), as the HF checkpoint had them

It loads without megatron (and without resharding at any TP/PP), and an export copies it back as it is. An export
of a frozen tower takes it from the first directory that has it: the checkpoint's own `vision.safetensors`, else an
HF directory's weights (the run never changed it). A trained tower (model.freeze_vision_tower=false) is in the
role's dist-checkpoint too (`vision_tower.*`, with its optimizer state): the export loads it from there
(`attach_trained_tower`, `trained_tower_tensors`). A text model has no tower: {} everywhere.
"""
from __future__ import annotations

from pathlib import Path

import torch

from rlhf_mcore.models.hf_io import LazyStateDict, weight_files
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.vision import VISION_FILE


def vision_prefix(hf_cfg: dict, source: str = "config.json") -> str | None:
    """The HF name prefix of the family's vision tower (None for a text model)."""
    return spec_for_hf_config(hf_cfg, source).vision_prefix


def split_vision(hf_sd, hf_cfg: dict, source: str = "config.json") -> dict[str, torch.Tensor]:
    """The tower's tensors of an HF state dict (aliases already applied: `visual.*`), read now; {} for a text model."""
    prefix = vision_prefix(hf_cfg, source)
    return {k: hf_sd[k] for k in hf_sd if k.startswith(prefix)} if prefix else {}


def save_vision(out_dir: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write `out_dir/vision.safetensors` (nothing for a text model)."""
    from safetensors.torch import save_file

    if tensors:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(out_dir) / VISION_FILE),
                  metadata={"format": "pt"})


def _read_dir(directory: Path, hf_cfg: dict, prefix: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (directory / VISION_FILE).is_file():
        return load_file(str(directory / VISION_FILE))
    try:
        files = weight_files(directory)
    except ValueError:
        return {}
    sd = LazyStateDict(files, spec_for_hf_config(hf_cfg).checkpoint_aliases)
    return split_vision(sd, hf_cfg)


def vision_for_export(hf_cfg: dict, dirs: list, dtype: torch.dtype, source: str) -> dict[str, torch.Tensor]:
    """The tower's tensors (HF names, in `dtype`) from the first of `dirs` that holds them; {} for a text model."""
    prefix = vision_prefix(hf_cfg, source)
    if prefix is None:
        return {}
    for directory in [Path(d) for d in dirs if d]:
        found = _read_dir(directory, hf_cfg, prefix) if directory.is_dir() else {}
        if found:
            return {k: v.to(dtype) for k, v in found.items()}
    raise ValueError(f"{source}: no vision tower tensors ('{prefix}*') in {VISION_FILE} or HF weights of "
                     f"{[str(d) for d in dirs if d]}. Convert with `tools.convert_checkpoint hf-to-mcore` or set "
                     "model.hf_path to the vision model's HF directory.")


def attach_trained_tower(model, hf_cfg: dict, model_cfg) -> bool:
    """Give the export's model (a TP1 actor, before its weights load) a trainable tower, so the checkpoint's
    `vision_tower.*` tensors load into it, where the run trained its tower (model.freeze_vision_tower=false);
    False (nothing done) for a frozen tower or a text model."""
    if model_cfg.freeze_vision_tower or vision_prefix(hf_cfg) is None:
        return False
    from rlhf_mcore.models.vision import attach_tower, build_vision_tower

    attach_tower(model, build_vision_tower(hf_cfg, next(model.parameters()).dtype, "cpu"), hf_cfg, trainable=True)
    return True


def trained_tower_tensors(model, hf_cfg: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The loaded tower of `attach_trained_tower` under its HF names (`visual.*`), in `dtype`."""
    from rlhf_mcore.models.vision import vision_side

    prefix = vision_prefix(hf_cfg)
    return {f"{prefix}{k}": v.detach().to(dtype) for k, v in vision_side(model).tower.state_dict().items()}
