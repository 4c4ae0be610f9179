"""Megatron side of checkpoint conversion: build a model for a role, load a full (TP1/PP1) state dict
into this rank's TP/PP shard, and save / load megatron dist-checkpoints atomically.

A converted checkpoint directory is a `dist_checkpointing` checkpoint (loadable at any TP/PP: megatron
reshards on load) with two additions beside it:

    out/                 dist-checkpoint files (metadata.json, .metadata, __*.distcp)
    out/hf/              config.json + tokenizer / generation files of the source HF model
    out/conversion.json  {"role", "dtype", "source", "saved_tp", "saved_pp", "padded_vocab_size"}
    out/vision.safetensors  a vision model's tower (`convert.vision_weights`), whole: it is never sharded
"""
from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_mcore.convert.vision_weights import save_vision
from rlhf_mcore.disk import publish_dir
from rlhf_mcore.models.full_weights import global_key as _global_key
from rlhf_mcore.models.full_weights import merged_linears, partition_dim, tp_split
from rlhf_mcore.models.hf_io import copy_aux_files, read_hf_config, write_config
from rlhf_mcore.models.roles import ROLES

log = logging.getLogger(__name__)

HF_SUBDIR = "hf"
META_FILE = "conversion.json"


def build_for_conversion(hf_config: dict, role: str, ctx, dtype: str, source: str = "config.json"):
    """The model of `role` at this rank's layout, with the param-free SDPA local spec (our table's names)."""
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.build import build_model

    model_cfg = ModelConfig(dtype=dtype, attention_backend="sdpa")
    parallel_cfg = ParallelConfig(tp=ctx.dims.tp, pp=ctx.dims.pp, ep=ctx.dims.ep)
    return build_model(role, hf_config, model_cfg, parallel_cfg, ctx, source=source)


def _fresh_head(model) -> bool:
    """The model's role may start without its head (a critic from an LM): the head keeps its init."""
    spec = ROLES.get(getattr(model, "role", ""))
    return spec is not None and spec.fresh_head


def needed_keys(model) -> set[str]:
    """Full-model keys this rank's shard reads (a last stage's tied output weight reads the embedding)."""
    adapters, _ = merged_linears(model)
    keys = {_global_key(model, key) for key, _ in model.named_parameters() if key not in adapters}
    if getattr(model, "share_embeddings_and_output_weights", False) and "output_layer.weight" in keys:
        keys.add("embedding.word_embeddings.weight")
    return keys


@torch.no_grad()
def load_full_state_dict(model, full_sd: dict[str, torch.Tensor], tp_rank: int, tp_size: int,
                         source: str = "converted state dict") -> None:
    """Copy a full TP1/PP1 megatron state dict into this rank's shard of `model` (any TP/PP)."""
    adapters, _ = merged_linears(model)  # LoRA adapters: not base weights (models.lora_export loads them)
    params = {k: p for k, p in model.named_parameters() if k not in adapters}
    tied = getattr(model, "share_embeddings_and_output_weights", False)
    for key, param in params.items():
        full_key = _global_key(model, key)
        if full_key not in full_sd and tied and full_key == "output_layer.weight":
            full_key = "embedding.word_embeddings.weight"  # last stage's copy of the tied embedding
        if full_key not in full_sd:
            if full_key == "output_layer.weight" and _fresh_head(model):
                continue  # value head not in the source: keep its initialisation
            raise ValueError(f"{source}: missing tensor '{full_key}' for model parameter '{key}'.")
        part = tp_split(full_sd[full_key], partition_dim(param, key), key, tp_rank, tp_size)
        if part.shape != param.shape:
            raise ValueError(f"{source}: tensor '{full_key}' gives shape {list(part.shape)} on TP rank "
                             f"{tp_rank}/{tp_size}, but the model parameter has {list(param.shape)}.")
        param.copy_(part)


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Tensor entries of a TP1/PP1 model's state dict (megatron's `_extra_state` placeholders dropped)."""
    return {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}


def _shared_tmp_dir(out_dir: Path) -> Path:
    """One temporary sibling of `out_dir`, named by rank 0 and known to every rank."""
    name = [f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return out_dir.parent / name[0]


def save_converted(model, out_dir: str | Path, hf_src_dir: str | Path, meta: dict, overwrite: bool = False,
                   vision: dict | None = None):
    """Collective: dist-checkpoint of `model` + hf/ + conversion.json (+ a vision model's tower, `vision`: HF name
    -> tensor, in vision.safetensors), renamed into `out_dir` at the end."""
    from megatron.core import dist_checkpointing

    out_dir = Path(out_dir).resolve()
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ValueError(f"{out_dir}: already exists and is not empty. Pass --overwrite or another --out.")
    tmp = _shared_tmp_dir(out_dir)
    try:
        if rank0:
            tmp.mkdir(parents=True)
        dist.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), str(tmp))
        dist.barrier()
        if rank0:
            (tmp / HF_SUBDIR).mkdir()
            write_config(tmp / HF_SUBDIR, read_hf_config(hf_src_dir))
            copy_aux_files(hf_src_dir, tmp / HF_SUBDIR)
            save_vision(tmp, vision or {})
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            publish_dir(tmp, out_dir)
    except BaseException:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return out_dir


def read_converted(ckpt_dir: str | Path) -> tuple[dict, dict]:
    """(HF config dict, conversion metadata) of a converted checkpoint directory."""
    ckpt_dir = Path(ckpt_dir)
    meta_path = ckpt_dir / META_FILE
    if not meta_path.is_file():
        raise ValueError(f"{meta_path}: not found. Pass a directory written by "
                         "`tools/convert_checkpoint.py hf-to-mcore`.")
    return read_hf_config(ckpt_dir / HF_SUBDIR), json.loads(meta_path.read_text())


def describe_checkpoint(ckpt_dir: str | Path, hf_dir: str | Path | None = None, role: str | None = None,
                        dtype: str | None = None) -> tuple[dict, Path, str, str]:
    """(HF config, directory holding it and the tokenizer files, role, dtype) of a megatron weights
    checkpoint: a converted directory carries all four (conversion.json, hf/); a training checkpoint's role
    directory (run/global_step_N/actor) needs `hf_dir`, and takes its role from its name."""
    from rlhf_mcore.models.weights import ROLES

    ckpt_dir = Path(ckpt_dir)
    meta = json.loads((ckpt_dir / META_FILE).read_text()) if (ckpt_dir / META_FILE).is_file() else {}
    hf_dir = Path(hf_dir) if hf_dir is not None else ckpt_dir / HF_SUBDIR
    if not (hf_dir / "config.json").is_file():
        raise ValueError(f"{ckpt_dir}: no {META_FILE} or {HF_SUBDIR}/config.json beside the weights. Pass "
                         "--hf-config with the HF directory of the model (config.json + tokenizer files).")
    role = role or meta.get("role") or (ckpt_dir.name if ckpt_dir.name in ROLES else None)
    if role is None:
        raise ValueError(f"{ckpt_dir}: cannot tell the model role from the directory. Pass --role "
                         f"(one of {', '.join(ROLES)}).")
    return read_hf_config(hf_dir), hf_dir, role, dtype or meta.get("dtype", "fp32")


def load_converted(model, ckpt_dir: str | Path) -> None:
    """Collective: load a converted checkpoint into `model` at its own layout (megatron reshards), through
    the trainer's own loader so that conversion and training read checkpoints the same way."""
    from rlhf_mcore.checkpoint.model_weights import load_model_weights

    load_model_weights(model, ckpt_dir, allow_missing=())
