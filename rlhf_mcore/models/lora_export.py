"""LoRA adapters in PEFT's format: export them TP-gathered under PEFT's names, and start from a PEFT adapter
directory (`model.lora_adapter_path`), at any TP/PP layout.

A PEFT adapter directory is what `peft.PeftModel.from_pretrained(base_model, adapter_dir)` reads:

    adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, lora_dropout, bias none, ...
    adapter_model.safetensors  base_model.model.<HF module>.lora_A.weight [r, in]
                               base_model.model.<HF module>.lora_B.weight [out, r]

where <HF module> is e.g. `model.layers.3.self_attn.q_proj` (the family's weight table names it; an MoE expert's
`model.layers.3.mlp.experts.5.gate_proj`, which peft fuses itself onto transformers 5's experts). PEFT adds
(lora_alpha / r) * B @ A to the module's weight, as `models.lora` does.

Our adapters (`models.lora`) sit on megatron's fused linears, one A/B pair per HF projection, registered as
`<linear>.lora_A.<sub>` / `<linear>.lora_B.<sub>` (sub = q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
down_proj). On a TP rank a column-parallel linear (linear_qkv, linear_fc1) holds B's rows of its own heads /
ffn slice and all of A; a row-parallel one (linear_proj, linear_fc2) holds A's columns of its input slice and
all of B. A TP rank's query groups are consecutive heads, so a sub-projection's shards joined in TP rank order
are the HF-shaped matrix: export is a concatenation, load a chunk.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from rlhf_mcore.models.full_weights import global_key, unwrap_model
from rlhf_mcore.models.lora_experts import fuse_expert_state, unfuse_expert_state

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_DIR = "lora_adapter"  # the PEFT adapter's place inside an HF export (never at its top: see save)
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ADAPTER_NAME = re.compile(r"^(?P<linear>.+)\.lora_(?P<ab>[AB])\.(?P<sub>\w+)$")


def split_adapter_name(name: str) -> tuple[str, str, str] | None:
    """An adapter parameter's name -> (its linear's path, 'A' | 'B', HF sub-projection); None for others.

    >>> split_adapter_name("decoder.layers.0.self_attention.linear_qkv.lora_B.k_proj")
    ('decoder.layers.0.self_attention.linear_qkv', 'B', 'k_proj')
    >>> split_adapter_name("decoder.layers.0.self_attention.linear_qkv.weight") is None
    True
    """
    match = _ADAPTER_NAME.match(name)
    return None if match is None else (match["linear"], match["ab"], match["sub"])


def adapter_entries(model) -> Iterator[tuple[str, str, str, torch.nn.Parameter]]:
    """(linear path, 'A' | 'B', sub-projection, parameter) of every adapter on this rank, in model order."""
    from rlhf_mcore.models.lora import adapter_parameters

    for name, param in adapter_parameters(model):
        parts = split_adapter_name(name)
        if parts is None:
            raise ValueError(f"LoRA: adapter parameter '{name}' is not named <linear>.lora_A|B.<sub>.")
        yield (*parts, param)


def split_dim(linear, ab: str) -> int:
    """The dimension TP splits adapter `ab` of `linear` along, -1 when every TP rank holds all of it: B's rows
    on a column-parallel linear, A's columns on a row-parallel one."""
    from megatron.core.tensor_parallel import RowParallelLinear

    if getattr(linear, "lora_expert", False):  # whole on its rank (expert TP 1)
        return -1
    row = isinstance(linear, RowParallelLinear)
    if ab == "A":
        return 1 if row else -1
    return -1 if row else 0


# a vision LM's transformers module tree nests its language model (Qwen2.5-VL, Qwen3-VL, -MoE in transformers 5);
# a PEFT adapter names the modules themselves, where checkpoints may use legacy names (transformers converts those)
VISION_LM_MODULES = ("model.", "model.language_model.")


def hf_module_names(hf_config: dict) -> dict[tuple[str, str], str]:
    """(full-model megatron linear path, sub-projection) -> HF module path, from the family's weight table:
    ('decoder.layers.0.self_attention.linear_qkv', 'q_proj') -> 'model.layers.0.self_attn.q_proj' (a vision LM's:
    'model.language_model.layers.0.self_attn.q_proj')."""
    from rlhf_mcore.models.registry import spec_for_hf_config
    from rlhf_mcore.models.weights import rules_for

    spec = spec_for_hf_config(hf_config)
    old, new = VISION_LM_MODULES if spec.vision_prefix else ("", "")
    out = {}
    for rule in rules_for(spec.text_config(hf_config), "actor", "config.json"):
        for key in rule.hf:
            module = key.removesuffix(".weight")
            module = new + module[len(old):] if old and module.startswith(old) else module
            out[(rule.mcore.removesuffix(".weight"), module.rsplit(".", 1)[-1])] = module
    return out


def peft_key(module: str, ab: str) -> str:
    """PEFT's saved name of adapter `ab` on HF module `module`.

    >>> peft_key("model.layers.3.self_attn.q_proj", "A")
    'base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight'
    """
    return f"{PEFT_PREFIX}{module}.lora_{ab}.weight"


def _peft_keys(model, hf_config: dict) -> Iterator[tuple[str, str, torch.nn.Module, torch.nn.Parameter]]:
    """(PEFT key, 'A' | 'B', linear, parameter) of this rank's adapters."""
    names = hf_module_names(hf_config)
    for linear_path, ab, sub, param in adapter_entries(model):
        full_linear = global_key(model, f"{linear_path}.weight").removesuffix(".weight")
        module = names.get((full_linear, sub))
        if module is None:
            raise ValueError(f"LoRA: no HF module in the weight table for '{full_linear}' / {sub}.")
        yield peft_key(module, ab), ab, model.get_submodule(linear_path), param


def _tp_gather(local: torch.Tensor, dim: int, ctx) -> torch.Tensor:
    if ctx.dims.tp == 1 or dim < 0:
        return local
    shards = [torch.empty_like(local) for _ in range(ctx.dims.tp)]
    dist.all_gather(shards, local.contiguous(), group=ctx.pgs.tp)
    return torch.cat(shards, dim=dim)


@torch.no_grad()
def lora_state_for_hf(model, hf_config: dict, ctx) -> dict[str, torch.Tensor]:
    """Collective over the model-parallel group: the full (TP-gathered, every pipeline stage's) adapters
    under PEFT's names, on CPU, on every rank. Adapters are small (r x (in + out) per projection)."""
    model = unwrap_model(model)
    state = {key: _tp_gather(param.detach(), split_dim(linear, ab), ctx).cpu()
             for key, ab, linear, param in _peft_keys(model, hf_config)}
    if ctx.dims.ep > 1:  # each rank of the stage's expert-parallel group holds other experts' adapters
        parts = [None] * ctx.dims.ep
        dist.all_gather_object(parts, state, group=ctx.pgs.ep)
        state = {k: v for part in parts for k, v in part.items()}
    if ctx.dims.pp > 1:
        stages = [None] * ctx.dims.pp
        dist.all_gather_object(stages, state, group=ctx.pgs.pp)
        state = {k: v for stage in stages for k, v in stage.items()}
    return _fused(hf_config, state, lambda: fuse_expert_state(state, model.lora_settings.target_modules))


def _fused(hf_config: dict, state: dict, convert) -> dict:
    """`convert()` where the adapter holds fused expert tensors (`lora_experts.adapter_fuses_experts`), else
    `state`."""
    from rlhf_mcore.models.lora_experts import adapter_fuses_experts

    return convert() if adapter_fuses_experts(hf_config) else state


def adapter_config(settings, base_model: str, hf_config: dict | None = None) -> dict:
    """adapter_config.json for `settings` (`models.lora.LoraSettings`) on the base model at `base_model`; a
    family storing its experts fused (`hf_config`) adds peft's target_parameters (`models.lora_experts`)."""
    from rlhf_mcore.models.lora_experts import adapter_fuses_experts, fused_adapter_fields

    fused = hf_config is not None and adapter_fuses_experts(hf_config)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": settings.rank, "lora_alpha": settings.alpha,
            "lora_dropout": settings.dropout, "target_modules": sorted(settings.target_modules), "bias": "none",
            "base_model_name_or_path": base_model, "fan_in_fan_out": False, "inference_mode": True,
            "use_rslora": False, "init_lora_weights": True, "modules_to_save": None,
            **(fused_adapter_fields(settings) if fused else {})}


def save_peft_adapter(out_dir: str | os.PathLike, state: dict[str, torch.Tensor], config: dict) -> Path:
    """Write a PEFT adapter directory atomically (a temporary sibling renamed into place; replaces `out_dir`).
    Kept out of an HF export's top directory: transformers' from_pretrained would see adapter_config.json
    there and load the adapter's base model instead of the merged weights beside it."""
    from safetensors.torch import save_file

    from rlhf_mcore.models.hf_io import atomic_dir

    with atomic_dir(out_dir, overwrite=True) as tmp:
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return Path(out_dir)


def read_adapter_config(adapter_dir: str | os.PathLike) -> dict:
    return json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())


def _targets(config: dict) -> set[str] | None:
    """PEFT's target_modules as a set of HF names (a list, or 'all-linear'); None for a regex string."""
    targets = config.get("target_modules")
    if targets == "all-linear":
        return set(ALL_LINEAR)
    return set(targets) if isinstance(targets, (list, tuple)) else None


def adapter_dir_errors(path: str, rank: int, alpha: float, target_modules, key: str = "model.lora_adapter_path"
                       ) -> list[str]:
    """Why the PEFT adapter directory `path` cannot start a run with model.lora_rank / lora_alpha /
    target_modules (expanded HF names) ([] = it can)."""
    files = [Path(path) / name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)]
    if not all(f.is_file() for f in files):
        return [f"{key}: no {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} in {path!r}. Point it at a PEFT adapter "
                f"directory (peft's save_pretrained output, or <hf export>/{ADAPTER_DIR})."]
    try:
        cfg = read_adapter_config(path)
    except (OSError, ValueError) as e:
        return [f"{key}: cannot read {files[0]} (got {path!r}): {e}. Write it with peft's save_pretrained."]
    errs = []
    if cfg.get("peft_type") != "LORA":
        errs.append(f"{key}: the adapter in {path} is {cfg.get('peft_type')!r}, not a LoRA adapter (got "
                    f"peft_type={cfg.get('peft_type')!r}). Use a LoRA adapter.")
    if cfg.get("r") != rank:
        errs.append(f"{key}: the adapter in {path} has r={cfg.get('r')} (got model.lora_rank={rank}). "
                    f"Set model.lora_rank={cfg.get('r')}.")
    if cfg.get("lora_alpha") != alpha:
        errs.append(f"{key}: the adapter in {path} has lora_alpha={cfg.get('lora_alpha')} (got "
                    f"model.lora_alpha={alpha}). Set model.lora_alpha={cfg.get('lora_alpha')}.")
    targets = _targets(cfg)
    if targets != set(target_modules):
        errs.append(f"{key}: the adapter in {path} targets {cfg.get('target_modules')!r} (got model.target_modules "
                    f"expanding to {sorted(target_modules)}). Set model.target_modules to the adapter's list.")
    for field, ours in (("bias", "none"), ("use_rslora", False), ("use_dora", False)):
        if cfg.get(field, ours) not in (ours, None):
            errs.append(f"{key}: the adapter in {path} has {field}={cfg.get(field)!r}, which our LoRA does not "
                        f"implement (got {cfg.get(field)!r}). Use an adapter with {field}={ours!r}.")
    return errs


@torch.no_grad()
def load_peft_adapter(model, adapter_dir: str, hf_config: dict, ctx) -> str:
    """Copy a PEFT adapter's A / B into this rank's adapters (its pipeline stage, its TP slice). Returns a
    description of the source for the log."""
    from safetensors import safe_open

    from rlhf_mcore.models.lora_experts import text_experts

    model = unwrap_model(model)
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    count = 0
    with safe_open(str(path), framework="pt") as f:  # adapters are small: read them all
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    settings = model.lora_settings
    tensors = _fused(hf_config, tensors, lambda: unfuse_expert_state(
        tensors, settings.target_modules, settings.rank, text_experts(hf_config), str(path)))
    for key, ab, linear, param in _peft_keys(model, hf_config):
        if key not in tensors:
            raise ValueError(f"{path}: missing tensor '{key}'. Is this adapter for this model and "
                             "model.target_modules?")
        full = tensors[key]
        dim = split_dim(linear, ab)
        part = full if dim < 0 or ctx.dims.tp == 1 else full.chunk(ctx.dims.tp, dim=dim)[ctx.tp_rank]
        if tuple(part.shape) != tuple(param.shape):
            raise ValueError(f"{path}: tensor '{key}' {list(full.shape)} gives {list(part.shape)} on TP rank "
                             f"{ctx.tp_rank}/{ctx.dims.tp}, but the adapter holds {list(param.shape)}.")
        param.copy_(part)
        count += 1
    return f"{adapter_dir} ({count} adapter tensors on this rank)"
