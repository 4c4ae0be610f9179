"""Export the actor of a training checkpoint as a Hugging Face checkpoint (config.json, safetensors, tokenizer).

`export_actor_to_hf(run, path)` is collective and cheap for the ranks: rank 0 starts one single-process,
CPU-only conversion (`python -m rlhf_mcore.convert.export ...`) while the others wait. That process
builds the actor at TP1/PP1 (megatron reshards whatever layout the run used), loads `path/actor` and writes
`run_dir/hf_export/global_step_N` with the converter's weight table (`rlhf_mcore.models.weights`). Once that
process succeeds, rank 0 writes `export_complete.json` (the sha256 of the source's checkpoint.json) into it: an
export without it (killed or failed), or of a checkpoint since saved again, is redone by the next run, after its
hidden temporary directories are removed.
Running it apart keeps the training process groups untouched and the GPUs free (a full TP1 copy of the
model lives only in that process's host memory).
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist

from rlhf_mcore.disk import disk_full_message, is_disk_full
from rlhf_mcore.logs import heartbeat
from rlhf_mcore.ports import free_port
from rlhf_mcore.trainer.guards import EXIT_DISK_FULL, EXIT_DIVERGED, EXIT_STARTUP

log = logging.getLogger(__name__)
EXPORT_DIR = "hf_export"
DONE_FILE = "export_complete.json"
# torchrun's variables: the export process is a world of its own
_RUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def export_actor_to_hf(run, path, reuse: bool = False) -> str:
    """Collective: write the actor of checkpoint `path` to run_dir/hf_export/<checkpoint name>; return that dir.
    reuse: keep an export of `path` that finished (export_complete.json matches), else (re)do it."""
    out = Path(run.run_dir).resolve() / EXPORT_DIR / Path(path).name
    failed = 0
    if not dist.is_initialized() or dist.get_rank() == 0:
        if reuse and finished_export(out, path):
            log.info("HF export %s: already complete for %s", out, Path(path).name)
        else:
            remove_unfinished(out)
            failed = _convert_in_subprocess(run.cfg.model, Path(path) / "actor", out)
            if not failed:
                mark_done(out, path)
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = [failed]
        dist.broadcast_object_list(flag, src=0)
        failed = flag[0]
    if failed == EXIT_DISK_FULL:  # the converter said so in one line above
        raise OSError(errno.ENOSPC, f"HF export of {path} to {out}: {os.strerror(errno.ENOSPC)}; the next run "
                      "(trainer.resume=auto) redoes it")
    if failed:
        raise RuntimeError(f"HF export of {path} failed (exit code {failed}); its output is in the log above. "
                           "The next run (trainer.resume=auto) redoes it; set trainer.export_hf=false to skip it, or "
                           "convert later with `python -m rlhf_mcore.convert.export --ckpt <global_step_N>/actor "
                           "--out DIR`.")
    return str(out)


def _source_digest(ckpt) -> str:
    with open(Path(ckpt) / "checkpoint.json", "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def mark_done(out: Path, ckpt) -> None:
    record = {"checkpoint": str(Path(ckpt).resolve()), "checkpoint_json_sha256": _source_digest(ckpt),
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = out / f".{DONE_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out / DONE_FILE)


def finished_export(out: Path, ckpt) -> bool:
    """True when `out` holds a finished export of checkpoint `ckpt` (the same save of it)."""
    try:
        record = json.loads((Path(out) / DONE_FILE).read_text())
        return record.get("checkpoint_json_sha256") == _source_digest(ckpt)
    except (OSError, ValueError, AttributeError):
        return False


def remove_unfinished(out: Path) -> list[Path]:
    """Delete what a killed export of `out` left: its hidden temporary siblings and an unmarked `out`."""
    doomed = [p for p in out.parent.glob(f".{out.name}.*") if p.is_dir()] if out.parent.is_dir() else []
    if out.exists() and not (out / DONE_FILE).is_file():
        doomed.append(out)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    if doomed:
        log.warning("HF export: removed unfinished %s (redoing the export)", ", ".join(p.name for p in doomed))
    return doomed


def _convert_in_subprocess(model_cfg, ckpt: Path, out: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k not in _RUN_ENV and not k.startswith("TORCHELASTIC_")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # host memory only; leave the GPUs to the training ranks
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(free_port())  # not the training job's port
    cmd = [sys.executable, "-m", "rlhf_mcore.convert.export", "--ckpt", str(ckpt), "--out", str(out),
           "--model-config", json.dumps(dataclasses.asdict(model_cfg))]
    start = time.perf_counter()
    with heartbeat(f"HF export of {ckpt}"):
        rc = subprocess.run(cmd, env=env).returncode
    if rc == 0:
        log.info("exported %s to %s in %.1fs", ckpt, out, time.perf_counter() - start)
    return rc


def hf_export_config(hf_cfg: dict, dtype: str) -> dict:
    """The config.json written beside the weights: the policy's HF config with the stored dtype."""
    cfg = {k: v for k, v in hf_cfg.items() if k != "torch_dtype"}
    cfg["dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    return cfg


def convert(ckpt: str, out: str, model_cfg) -> Path:
    """One process (world size 1): dist-checkpoint of an actor -> HF directory at `out` (replaced atomically).
    A LoRA actor exports merged weights (W + scale B @ A: transformers loads them as any model) and, in
    `out/lora_adapter/`, its PEFT adapter for the base model (`peft.PeftModel.from_pretrained`)."""
    from rlhf_mcore.checkpoint.model_weights import load_model_weights
    from rlhf_mcore.config.schema import ParallelConfig
    from rlhf_mcore.convert.mcore import full_state_dict
    from rlhf_mcore.convert.vision_weights import attach_trained_tower, trained_tower_tensors, vision_for_export
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.full_weights import FullWeights
    from rlhf_mcore.models.hf_io import save_hf_checkpoint
    from rlhf_mcore.models.lora import is_lora_model
    from rlhf_mcore.models.lora_export import ADAPTER_DIR
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.models.vision import TOWER_NAME
    from rlhf_mcore.models.weights import mcore_to_hf
    from rlhf_mcore.parallel import destroy_distributed, init_distributed

    ctx = init_distributed(1, 1)
    try:
        hf_cfg = load_hf_config(model_cfg)
        model = build_model("actor", hf_cfg, model_cfg, ParallelConfig(), ctx)
        lora = is_lora_model(model)
        trained_tower = attach_trained_tower(model, hf_cfg, model_cfg)  # its checkpoint holds it: vision_tower.*
        if lora:  # the checkpoint holds the adapters only: the base comes from where the run took it
            load_lora_actor(model, ckpt, model_cfg, hf_cfg, ctx)
        else:
            load_model_weights(model, ckpt)
        full = FullWeights(model, ctx) if lora else full_state_dict(model)  # LoRA: merged weights
        if trained_tower:
            full = {k: v for k, v in full.items() if not k.startswith(f"{TOWER_NAME}.")}
        hf_sd = mcore_to_hf(full, hf_cfg, role="actor", source=ckpt)
        dtype = next(iter(hf_sd.values())).dtype
        hf_sd.update(trained_tower_tensors(model, hf_cfg, dtype) if trained_tower
                     else vision_for_export(hf_cfg, tower_dirs(ckpt, model_cfg), dtype, ckpt))
        check_finite(hf_sd, ckpt)
        saved = save_hf_checkpoint(out, hf_sd, hf_export_config(hf_cfg, model_cfg.dtype), aux_dirs(model_cfg),
                                   overwrite=True, generation=generation_config(model_cfg))
        if lora:
            save_lora_adapter(model, Path(out) / ADAPTER_DIR, model_cfg, hf_cfg, ctx)
        return saved
    finally:
        destroy_distributed()


def tower_dirs(ckpt: str, model_cfg) -> list[str]:
    """Where a vision model's export finds its (frozen) tower, in order: the checkpoint's own vision.safetensors,
    then model.load's (a converted checkpoint), then model.hf_path's weights."""
    return [d for d in (ckpt, model_cfg.load, model_cfg.hf_path) if d]


def aux_dirs(model_cfg) -> list[str]:
    """Where the export's tokenizer and generation files come from: model.hf_path, then model.tokenizer's
    directory (its tokenizer files win)."""
    dirs = [d for d in (model_cfg.hf_path, model_cfg.tokenizer) if d and os.path.isdir(d)]
    return list(dict.fromkeys(dirs))


def generation_config(model_cfg) -> dict:
    """generation_config.json's fields that the export sets: the run's stop set (`rlhf_mcore.stop_tokens`) as
    `eos_token_id`, so transformers stops where the rollout engines did, whichever directory the tokenizer came
    from. {} without a tokenizer (nothing is changed then)."""
    from rlhf_mcore.stop_tokens import stop_set, stop_sources
    from rlhf_mcore.tokenizer import load_tokenizer
    from rlhf_mcore.tokenizer_bytes import ByteTokenizer

    path = model_cfg.tokenizer or model_cfg.hf_path
    if not path:
        return {}
    try:
        tokenizer = ByteTokenizer() if path == "bytes" else load_tokenizer(path)
    except ValueError:  # a model directory without a tokenizer: its own generation_config.json stays as it is
        return {}
    ids = stop_set(stop_sources(tokenizer, model_cfg.hf_path))
    return {"eos_token_id": list(ids) if len(ids) > 1 else ids[0]} if ids else {}


def load_lora_actor(model, ckpt: str, model_cfg, hf_cfg: dict, ctx) -> None:
    """A LoRA actor of a training checkpoint: its base as the run started it (model.hf_path's weights,
    model.load, or the fixed-seed random init of an inline model), then the checkpoint's adapters."""
    from megatron.core import dist_checkpointing

    from rlhf_mcore.checkpoint.keys import apply_model_state
    from rlhf_mcore.checkpoint.model_weights import load_model_weights
    from rlhf_mcore.checkpoint.safe_load import check_loadable
    from rlhf_mcore.models.hf_load import load_hf_weights, weight_source
    from rlhf_mcore.models.lora import checkpointed_state

    kind, where = weight_source(model_cfg)
    if kind == "hf":
        load_hf_weights(model, where, hf_cfg, ctx.tp_rank, ctx.dims.tp)
    elif kind == "load":
        load_model_weights(model, where)
    sharded, left_out = checkpointed_state(model)
    check_loadable(ckpt)  # nothing in the checkpoint runs code (checkpoint/safe_load.py)
    state = dist_checkpointing.load(sharded, str(ckpt))
    state = {name: v for name, v in state.items() if name in sharded}  # drop the checkpoint's common (optimizer) state
    apply_model_state(model, state, str(ckpt), left_out)


def save_lora_adapter(model, out: Path, model_cfg, hf_cfg: dict, ctx) -> Path:
    """The PEFT adapter directory of a LoRA actor (`models.lora_export`): peft loads it onto the base at
    adapter_config.json's base_model_name_or_path (model.hf_path)."""
    from rlhf_mcore.models.lora_export import adapter_config, lora_state_for_hf, save_peft_adapter

    base = os.path.abspath(model_cfg.hf_path) if model_cfg.hf_path else ""
    config = adapter_config(model.lora_settings, base, hf_cfg)
    return save_peft_adapter(out, lora_state_for_hf(model, hf_cfg, ctx), config)


class NonFiniteExportError(ValueError):
    """The weights to export hold inf or nan."""


def check_finite(state_dict: dict, source) -> None:
    """Refuse to export weights that hold inf or nan (ValueError naming the tensors)."""
    bad = [k for k, v in state_dict.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise NonFiniteExportError(f"{source}: refusing to export non-finite weights: {len(bad)} of "
                                   f"{len(state_dict)} tensors hold inf or nan (first: {bad[0]}). Export an earlier "
                                   "checkpoint.")


def main(argv=None) -> int:
    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.config.schema import ModelConfig
    from rlhf_mcore.logs import init_logger

    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.convert.export",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="an actor dist-checkpoint, e.g. runs/x/global_step_N/actor")
    parser.add_argument("--out", required=True, help="HF directory to write (replaced if it exists)")
    parser.add_argument("--config", help="the run's config.yaml (default: the one in the run directory of --ckpt)")
    parser.add_argument("--model-config", help="the run's `model` section as JSON (instead of --config)")
    args = parser.parse_args(argv)
    init_logger(0)
    if args.model_config:
        model_cfg = ModelConfig(**json.loads(args.model_config))
    else:
        model_cfg = load_config(args.config or str(Path(args.ckpt).resolve().parents[1] / "config.yaml")).model
    try:
        convert(args.ckpt, args.out, model_cfg)
    except ValueError as e:
        print(f"export failed: {e}", file=sys.stderr)
        return EXIT_DIVERGED if isinstance(e, NonFiniteExportError) else EXIT_STARTUP
    except Exception as e:  # noqa: BLE001 - a full disk is one line whatever raised it (OSError, SafetensorError)
        if not is_disk_full(e):
            raise
        print(f"export failed: {disk_full_message(e, args.out)}", file=sys.stderr)
        return EXIT_DISK_FULL
    return 0


if __name__ == "__main__":
    sys.exit(main())
