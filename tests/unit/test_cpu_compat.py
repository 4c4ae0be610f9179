"""The megatron-core CPU patches: each still has its call site (an upgrade that moves one fails here
loudly), and each call site runs on CPU once patched."""
import importlib
import inspect

import pytest
import torch

from rlhf_mcore import cpu_compat

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU patches apply only without CUDA")


@pytest.mark.parametrize("module", sorted(cpu_compat.CUDA_LITERAL_MODULES))
def test_each_cuda_literal_site_still_exists(module, mcore_ctx):
    source = inspect.getsource(importlib.import_module(module))
    assert "device='cuda'" in source or 'device="cuda"' in source, (
        f"megatron-core no longer builds tensors with device='cuda' in {module}: "
        f"remove it from cpu_compat.CUDA_LITERAL_MODULES (served: {cpu_compat.CUDA_LITERAL_MODULES[module]})")


def test_patched_sites_run_on_cpu(mcore_ctx):
    from megatron.core.optimizer import clip_grads, grad_scaler
    from megatron.core.transformer import utils

    assert torch.cuda.current_device() == "cpu"  # P1
    assert utils.get_default_causal_mask(4).device.type == "cpu"  # P2 (transformer.utils)
    assert grad_scaler.ConstantGradScaler(2.0).scale.device.type == "cpu"  # P2 (optimizer.grad_scaler)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    norm = clip_grads.get_grad_norm_fp32([p.grad])  # P2 (optimizer.clip_grads)
    assert abs(float(norm) - 12 ** 0.5) < 1e-6
    torch.cuda.synchronize()  # P3: a no-op, not an error
    assert torch.ones(1).type() == "torch.cuda.FloatTensor"  # P4
    assert torch.ones(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.ones(1).type(torch.float64).dtype == torch.float64  # with an argument: untouched
    t = torch.ones(2)
    assert t.cuda() is t  # P5


def test_tensor_cuda_call_sites_still_exist(mcore_ctx):
    from megatron.core.models.common.language_module import language_module

    assert ".cuda()" in inspect.getsource(language_module), "P5 no longer needed in language_module: remove it"


def test_apply_is_idempotent(mcore_ctx):
    assert cpu_compat.apply_cpu_patches() is True
    assert cpu_compat.apply_cpu_patches() is True


def test_cuda_rng_state_sites_still_exist_and_full_recompute_runs(mcore_ctx):
    """P7: megatron's activation checkpointing saves the CUDA RNG state; on CPU it must run and give the same
    loss and gradients as no recompute (verl's enable_gradient_checkpointing maps to model.recompute=full)."""
    import dataclasses

    from megatron.core.tensor_parallel import random

    source = inspect.getsource(random)
    assert "_get_cuda_rng_state(" in source and "_set_cuda_rng_state(" in source, "P7 no longer needed: remove it"
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.transformer_config import load_hf_config
    from tests.support.tiny import tiny_model_config

    cfg = tiny_model_config()
    tokens = torch.randint(0, 250, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).unsqueeze(0).expand_as(tokens)
    results = []
    for recompute in ("none", "full"):
        torch.manual_seed(0)
        model_cfg = dataclasses.replace(cfg.model, recompute=recompute)
        model = build_model("actor", load_hf_config(model_cfg), model_cfg, cfg.parallel, mcore_ctx)
        loss = model(tokens, pos, None).float().square().mean()
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert len(grads_a) == len(grads_b) > 0 and torch.equal(loss_a, loss_b)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b))



def test_megatron_fusions_import_with_the_noop_decorator_on_cpu(mcore_ctx):
    """P8: megatron imported after rlhf_mcore (as every entry point does) decorates its fusion kernels with its
    noop_decorator on a machine without CUDA: no torch.compile wrapper, so no torch._dynamo or inductor at a
    process's start (a tiny run: 5.84 -> 4.68 s); the kernels are the plain functions (none runs on a CPU)."""
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    import megatron.core.jit as jit
    from megatron.core.fusions import fused_bias_swiglu

    assert jit.jit_fuser is jit.noop_decorator
    assert type(fused_bias_swiglu.swiglu).__name__ == "function"
