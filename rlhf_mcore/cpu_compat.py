"""Every patch megatron-core 0.16.1 needs to run on a machine without CUDA, in one place.

Applied by `apply_cpu_patches()` only when `torch.cuda.is_available()` is False (P8, `without_jit_fuser`, at
megatron's import, from `rlhf_mcore.__init__`); on a GPU this module changes nothing. Each patch names the call
sites it serves.
`tests/unit/test_cpu_compat.py` fails loudly if a megatron-core upgrade moves a call site out from under a patch.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import types

import torch

log = logging.getLogger(__name__)

# P2: modules that build tensors with a literal device="cuda" (module -> call sites served).
CUDA_LITERAL_MODULES = {
    # total_num_tokens buffers in forward_backward_no_pipelining / _with_interleaving / _without_interleaving
    "megatron.core.pipeline_parallel.schedules": "total_num_tokens = torch.zeros(..., device='cuda')",
    # found_inf / _dummy_overflow_buf / _scale_one in MixedPrecisionOptimizer, _scale in FP32Optimizer
    "megatron.core.optimizer.optimizer": "found_inf, _dummy_overflow_buf, _scale_one, _scale",
    # total_norm_cuda, dummy_overflow_buf, grad_norm, total_num_zeros in get_grad_norm_fp32 / count_zeros
    "megatron.core.optimizer.clip_grads": "total_norm_cuda, dummy_overflow_buf, grad_norm, total_num_zeros",
    # ConstantGradScaler / DynamicGradScaler scale, min_scale, growth and backoff factors
    "megatron.core.optimizer.grad_scaler": "_scale, min_scale, growth_factor, backoff_factor",
    # l2 norm all-reduce buffer in core.utils (used by grad-norm helpers)
    "megatron.core.utils": "l2_cuda = torch.tensor(..., device='cuda')",
    # causal mask built when attention_mask is None (get_default_causal_mask, sliding window mask)
    "megatron.core.transformer.utils": "torch.ones(sq, sq, device='cuda')",
}

class _CpuStream:
    """The one stream of a CPU process (P6): every instance is that stream; waiting and synchronising do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __eq__(self, other) -> bool:
        return isinstance(other, _CpuStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, other) -> None:
        return None

    def record_event(self, *args) -> "_CpuStream":  # the event's synchronize() is this stream's: a no-op
        return self

    def synchronize(self) -> None:
        return None


_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like")
_applied = False


def _to_cpu_device(device):
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    return device


def _cpu_factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    return wrapper


def _torch_proxy() -> types.ModuleType:
    """A stand-in for `torch` inside one module: factory functions map device='cuda' to the CPU."""
    proxy = types.ModuleType("torch_cpu_proxy")
    proxy.__getattr__ = lambda name: getattr(torch, name)  # type: ignore[attr-defined]
    for name in _FACTORIES:
        setattr(proxy, name, _cpu_factory(getattr(torch, name)))
    return proxy


_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
}


def _cuda_named_type(original):
    @functools.wraps(original)
    def tensor_type(self, *args, **kwargs):
        if args or kwargs or self.device.type != "cpu" or self.dtype not in _CUDA_TYPE_NAMES:
            return original(self, *args, **kwargs)
        return _CUDA_TYPE_NAMES[self.dtype]

    return tensor_type


def without_jit_fuser(jit_module) -> None:
    """P8, at import (`rlhf_mcore.__init__` runs it right after megatron.core.jit executes): megatron sets
    `jit_fuser = torch.compile`, and megatron.core.fusions.* (bias_geglu, bias_swiglu, bias_dropout_add, ...)
    decorate their kernels with it as they are imported; each decoration loads torch._dynamo and inductor, about a
    second of every process's start. Without CUDA none of those kernels runs (`models.transformer_config` turns the
    fusions off), so the decorator becomes megatron's own `noop_decorator` (`disable_jit_fuser`)."""
    if not torch.cuda.is_available():
        jit_module.disable_jit_fuser()


def apply_cpu_patches() -> bool:
    """Patch megatron-core for CPU. Returns True when patches were applied (no CUDA), else False."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    # P1: torch.cuda.current_device() -> "cpu". ~175 call sites: RoPE and attention buffers, TP comm
    # buffers, p2p communication, DDP grad buffers, dist-checkpointing.
    torch.cuda.current_device = lambda: "cpu"
    # P2: per-module torch proxy for literal device="cuda" (CUDA_LITERAL_MODULES lists the sites).
    for name in CUDA_LITERAL_MODULES:
        importlib.import_module(name).torch = _torch_proxy()
    # P3: torch.cuda.synchronize -> no-op. dist_checkpointing save, PP p2p with variable sequence lengths.
    torch.cuda.synchronize = lambda *a, **k: None
    # P4: Tensor.type() with no argument reports CPU tensors under CUDA type names. Checked by
    # optimizer.optimizer (Float16OptimizerWithFloat16Params) and optimizer.distrib_optimizer
    # (param groups for bf16 / fp32 params) as `param.type() == 'torch.cuda.FloatTensor'`.
    torch.Tensor.type = _cuda_named_type(torch.Tensor.type)
    # P5: Tensor.cuda() -> the tensor itself. LanguageModule.setup_embeddings_and_output_layer
    # (`weight.data.cuda()` for tied embeddings at PP > 1) and dist_checkpointing.exchange_utils.
    torch.Tensor.cuda = lambda self, *a, **k: self
    # P6: CUDA streams -> one no-op stream. MoEAlltoAllTokenDispatcher.__init__ (`cuda_dtoh_stream =
    # torch.cuda.Stream()`) and _maybe_dtoh_and_synchronize (current_stream / wait_stream / torch.cuda.stream /
    # record_event().synchronize()):
    # with a single stream `on_side_stream` is False, so maybe_move_tensor_to_cpu never calls record_stream.
    torch.cuda.Stream = _CpuStream  # a class: libraries (transformers) write `torch.cuda.Stream | None` annotations
    torch.cuda.current_stream = lambda *a, **k: _CpuStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    # P7: the CUDA RNG state -> an empty state that restores nothing (the CPU generator is saved by megatron
    # itself). tensor_parallel.random: CheckpointFunction.forward / backward (`model.recompute=full`,
    # verl's enable_gradient_checkpointing) through _get_all_rng_states / _set_all_rng_states / _fork_rng,
    # and CudaRNGStatesTracker.add / fork.
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random._get_cuda_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    random._set_cuda_rng_state = lambda *a, **k: None
    _applied = True
    log.info("CUDA absent: applied megatron-core CPU patches P1-P7 (rlhf_mcore/cpu_compat.py)")
    return True
