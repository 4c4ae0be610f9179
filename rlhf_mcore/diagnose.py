"""`python -m rlhf_mcore.diagnose [--config CFG [a.b=value ...]]`: what this machine has and which code
paths a config would take, and why (verl users know this as `scripts/diagnose.py`).

Prints the devices, CUDA/NCCL versions and package versions; whether Transformer Engine, apex and SGLang
import; and, for a config, the attention, norm, rollout, log-prob kernel and distributed paths, and what LoRA
trains and saves (the start-up line of each LoRA role). Nothing is built and no process group is started.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys

PACKAGES = ("torch", "megatron-core", "transformers", "triton", "numpy", "pyarrow", "safetensors", "tokenizers",
            "gguf", "tensorboard", "wandb", "matplotlib", "transformer-engine", "apex", "sglang", "flash-attn")
OPTIONAL_IMPORTS = (("Transformer Engine", "transformer_engine"), ("apex", "apex"), ("SGLang", "sglang"),
                    ("Triton", "triton"), ("wandb", "wandb"))


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed" (nothing is imported)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def try_import(module: str) -> str:
    """"yes", "not installed", or "fails: <error>" (installed but broken, e.g. a CUDA mismatch)."""
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any import failure is the answer here
        return f"fails: {type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
    return "yes"


def device_lines() -> list[str]:
    import torch

    lines = [f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs",
             f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"]
    if not torch.cuda.is_available():
        return lines + ["CUDA: not available (CPU: gloo process groups, megatron CPU patches)"]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "unknown"
    lines.append(f"CUDA devices: {torch.cuda.device_count()}, NCCL {nccl}")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        lines.append(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}")
    return lines


def code_paths(cfg, have_cuda: bool, have_te: bool, have_triton: bool, sglang_status: str) -> list[tuple[str, str]]:
    """(what, which path and why) for a config on a machine with the given capabilities.

    >>> from rlhf_mcore.config.schema import Config
    >>> dict(code_paths(Config(), False, False, False, "not installed"))["attention"]
    'sdpa: model.attention_backend=auto and Transformer Engine is not importable'
    """
    backend = cfg.model.attention_backend
    if backend == "auto":
        attention = ("te: model.attention_backend=auto and Transformer Engine imports" if have_te else
                     "sdpa: model.attention_backend=auto and Transformer Engine is not importable")
    else:
        attention = f"{backend}: set by model.attention_backend"
    norm = ("Transformer Engine's fused RMSNorm (te layer spec)" if attention.startswith("te") else
            "torch.nn.RMSNorm (rlhf_mcore.models.norm: works with sequence parallelism, no apex needed)")
    engine = cfg.rollout.engine
    rollout = "native: decodes with the actor's own megatron modules (KV cache), any TP/PP layout"
    if engine == "sglang":
        rollout = f"sglang: embedded engine per GPU (SGLang import: {sglang_status})"
    kernel = ("Triton: CUDA and triton importable" if have_cuda and have_triton else
              "torch chunks: " + ("no CUDA" if not have_cuda else "triton not importable"))
    return [("attention", attention), ("norm", norm), ("rollout", rollout),
            ("log-prob kernel", f"fused chunked vocab-parallel log-prob/entropy, {kernel}"),
            ("distributed", "NCCL" if have_cuda else "gloo, with megatron CPU patches (rlhf_mcore.cpu_compat)"),
            ("dtype", f"{cfg.model.dtype}" + (" (bf16 on CPU is slow: use model.dtype=fp32)"
                                              if cfg.model.dtype == "bf16" and not have_cuda else "")),
            ("layout", f"tp={cfg.parallel.tp} pp={cfg.parallel.pp}; dp = world size / (tp*pp)")]


def lora_lines(cfg) -> list[str]:
    """The LoRA roles' start-up lines (trainable parameters, memory saved per GPU at the config's tp x pp, dp 1),
    from the model's HF config; empty without LoRA."""
    from rlhf_mcore.models.lora import LoraSettings
    from rlhf_mcore.models.lora_budget import describe, lora_budget
    from rlhf_mcore.models.transformer_config import load_hf_config
    from rlhf_mcore.trainer.roles import needs_critic, needs_ref

    ranks = (("actor", cfg.model.lora_rank), ("critic", cfg.critic.lora_rank if needs_critic(cfg) else 0))
    if not any(rank for _, rank in ranks):
        return []
    try:
        hf = load_hf_config(cfg.model)
    except (OSError, ValueError) as err:
        return [f"lora: the model's config cannot be read ({err})"]
    lines = []
    for role, rank in ranks:
        settings = LoraSettings.from_model_cfg(cfg.model, rank=rank)
        if settings is None:
            continue
        kind = "none" if role == "critic" or not needs_ref(cfg) else "separate" if cfg.ref.load else "shared"
        budget = lora_budget(hf, settings, cfg.model.dtype, cfg.parallel.tp, cfg.parallel.pp, 1,
                             cfg.parallel.use_distributed_optimizer, ref_shared=kind == "shared")
        lines.append(f"{role} {describe(budget, settings, kind)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_mcore.diagnose", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a config to explain (code paths it would take)")
    parser.add_argument("overrides", nargs="*", help="a.b=value overrides for --config")
    args = parser.parse_args(argv)
    print("== machine")
    for line in device_lines():
        print(" ", line)
    print("== packages")
    for name in PACKAGES:
        print(f"  {name:<20} {package_version(name)}")
    print("== optional imports")
    status = {module: try_import(module) for _, module in OPTIONAL_IMPORTS}
    for label, module in OPTIONAL_IMPORTS:
        print(f"  {label:<20} {status[module]}")
    if args.config:
        import torch

        from rlhf_mcore.config.load import ConfigError, load_config

        try:
            cfg = load_config(args.config, args.overrides, check=False)
        except ConfigError as err:
            print(f"== config {args.config}: cannot be read\n{err}")
            return 2
        try:
            load_config(args.config, args.overrides)
            print(f"== config {args.config}: valid")
        except ConfigError as err:
            print(f"== config {args.config}: a run would stop here\n{err}")
        print(f"== code paths for {args.config}")
        for what, why in code_paths(cfg, torch.cuda.is_available(), status["transformer_engine"] == "yes",
                                    status["triton"] == "yes", status["sglang"]):
            print(f"  {what:<16} {why}")
        for line in lora_lines(cfg):
            print(f"  {line}")
        from rlhf_mcore.plan.phases import plan_line

        gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0.0
        print(f"  {plan_line(cfg, gpu_bytes=gpu)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
