"""A tiny Qwen3-MoE on a GPU in bf16 (skipped without CUDA): the grouped experts (torch._grouped_mm, the default
there) against megatron's SequentialMLP at the model level, each against an fp32 SequentialMLP model with the same
weights (logits and parameter gradients, relative norm errors: the grouped error is no larger than twice the
loop's own bf16 error plus a floor), and the native engine decoding the grouped-expert model eagerly (no CUDA
graph for MoE, said by graph_blockers) with rollout log-probs equal to the trainer's forward within bf16 noise."""
import dataclasses

import pytest
import torch

from tests.support.tiny_moe import VOCAB, tiny_moe

pytestmark = pytest.mark.gpu


def build(path, hf_cfg, ctx, impl: str, dtype: str, **model_fields):
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_load import load_hf_weights

    model_cfg = dataclasses.replace(ModelConfig(dtype=dtype, attention_backend="sdpa"), moe_expert_impl=impl,
                                    **model_fields)
    model = build_model("actor", hf_cfg, model_cfg, ParallelConfig(), ctx)
    load_hf_weights(model, str(path), hf_cfg, 0, 1)
    return model


def logits_and_grads(model, tokens, ctx):
    from rlhf_mcore.models.logprobs import full_logits

    pos = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0).expand_as(tokens)
    out = full_logits(model, model(tokens, pos, None), ctx.pgs.tp).float()  # [b, s, V]
    out.log_softmax(-1)[..., 7].sum().backward()
    grads = {k: p.main_grad if getattr(p, "main_grad", None) is not None else p.grad
             for k, p in model.named_parameters()}
    return out.detach(), {k: g.float() for k, g in grads.items() if g is not None}


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (a norm, not a max: bf16 may flip a near-tie routing choice of a few tokens)."""
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def grouped_mm_case(moe_dir, ctx):
    """(config.json, tokens [4, 64] on the device) where torch._grouped_mm runs; a skip elsewhere."""
    from rlhf_mcore.models.hf_io import read_hf_config

    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._grouped_mm needs torch >= 2.8 and SM90")
    tokens = torch.randint(0, VOCAB, (4, 64), generator=torch.Generator().manual_seed(3)).to(ctx.device)
    return read_hf_config(moe_dir), tokens


def assert_grads_close(exact: dict, loop: dict, grouped: dict) -> None:
    """The grouped bf16 gradients' error against fp32 is of the loop's own order: over all of them together (2x the
    loop's + 1e-2), and in each tensor (2x + 5e-2). One expert sees few of the 256 tokens here, so a near-tie
    routing flip in one of them (grouped_mm and the loop accumulate layer 0 differently) moves that expert's
    gradient by a few percent (H100: 4.2e-2 against the loop's 1.3e-2); a wrong gradient is off by order 1."""
    keys = [k for k, g in exact.items() if g.norm() > 0]  # an expert no token chose has none
    flat = {name: torch.cat([g[k].flatten() for k in keys]) for name, g in
            (("exact", exact), ("loop", loop), ("grouped", grouped))}
    e_loop, e_grouped = rel_error(flat["loop"], flat["exact"]), rel_error(flat["grouped"], flat["exact"])
    per_key = {k: (rel_error(grouped[k], exact[k]), rel_error(loop[k], exact[k])) for k in keys}
    worst = max(per_key, key=lambda k: per_key[k][0] - 2 * per_key[k][1])
    print(f"bf16 grads rel err vs fp32, all: sequential {e_loop:.2e}, grouped_mm {e_grouped:.2e}; worst tensor "
          f"{worst}: grouped {per_key[worst][0]:.2e} loop {per_key[worst][1]:.2e}")
    assert e_grouped <= 2 * e_loop + 1e-2
    for key, (e_g, e_l) in per_key.items():
        assert e_g <= 2 * e_l + 5e-2, f"{key}: grouped {e_g:.2e} loop {e_l:.2e}"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe_gpu")
    tiny_moe(norm_topk_prob=True).save_pretrained(str(path))
    return path


def test_grouped_mm_model_matches_sequential_in_bf16(moe_dir, mcore_ctx):
    from rlhf_mcore.models.experts_grouped import GroupedExperts

    hf_cfg, tokens = grouped_mm_case(moe_dir, mcore_ctx)
    results = []
    for impl, dtype in (("sequential", "fp32"), ("sequential", "bf16"), ("auto", "bf16")):
        model = build(moe_dir, hf_cfg, mcore_ctx, impl, dtype)
        experts = model.decoder.layers[0].mlp.experts
        assert isinstance(experts, GroupedExperts) == (impl == "auto")
        if impl == "auto":
            assert experts.kernel == "grouped_mm"
        results.append(logits_and_grads(model, tokens, mcore_ctx))
    (exact, exact_g), (loop, loop_g), (grouped, grouped_g) = results
    err_loop, err_grouped = rel_error(loop, exact), rel_error(grouped, exact)
    print(f"tiny qwen3-moe bf16 logits rel err vs fp32: sequential {err_loop:.2e}, grouped_mm {err_grouped:.2e}")
    assert err_grouped <= 2 * err_loop + 2e-3
    assert set(grouped_g) == set(exact_g) == set(loop_g)
    assert_grads_close(exact_g, loop_g, grouped_g)


def test_native_engine_decodes_the_grouped_moe_eagerly(moe_dir, mcore_ctx):
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.rollout.native import NativeRolloutEngine
    from rlhf_mcore.rollout.static_decode import graph_blockers
    from rlhf_mcore.rollout.types import SamplingParams

    model = build(moe_dir, read_hf_config(moe_dir), mcore_ctx, "auto", "bf16").eval()
    assert any("decode_paths lacks 'static'" in b for b in graph_blockers(model, mcore_ctx))
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    assert engine.static is None  # eager, logged, no AttributeError
    prompts = [[3, 4, 5, 6, 9, 11], [7, 8], list(range(20, 40))]
    batch = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=12, temperature=1.0, seed=1))
    tokens = batch.tokens.to(mcore_ctx.device)
    with torch.no_grad():
        pos = torch.arange(tokens.size(1), device=tokens.device)[None].expand_as(tokens)
        logp, _ = token_logprobs(model, model(tokens, pos, None), tokens, mcore_ctx.pgs.tp)
    cols = torch.arange(tokens.size(1), device=batch.prompt_lengths.device)[None]
    start = batch.prompt_lengths[:, None]
    mask = ((cols >= start) & (cols < start + batch.response_lengths[:, None])).to(tokens.device)
    gap = (logp.float() - batch.rollout_logprobs.to(tokens.device).float()).abs()[mask]
    print(f"grouped MoE eager decode vs trainer forward (bf16): mean {gap.mean():.2e} max {gap.max():.2e}")
    assert mask.sum() == 3 * 12 and gap.mean() <= 2e-2


@pytest.mark.parametrize("rank", [8, 12])
def test_lora_on_the_grouped_experts_matches_the_fp32_loop_in_bf16(moe_dir, mcore_ctx, rank):
    """LoRA on every expert (models/lora_experts.py): the grouped experts add low-rank grouped GEMMs in bf16
    (torch._grouped_mm at rank 8; rank 12 is not 16-byte aligned: the reference loop), the loop runs the hooks;
    each against the fp32 loop with the same adapters, the grouped error in the logits and the adapters' gradients
    is no larger than twice the loop's own bf16 error (+ a floor)."""
    from rlhf_mcore.models.lora import adapter_parameters

    hf_cfg, tokens = grouped_mm_case(moe_dir, mcore_ctx)
    results = []
    for impl, dtype in (("sequential", "fp32"), ("sequential", "bf16"), ("auto", "bf16")):
        model = build(moe_dir, hf_cfg, mcore_ctx, impl, dtype, lora_rank=rank, lora_alpha=2.0 * rank)
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():  # the same adapters in all three, B != 0
            for _, p in adapter_parameters(model):
                p.add_((torch.randn(p.shape, generator=gen) * 0.1).to(p.device, p.dtype))
        out, grads = logits_and_grads(model, tokens, mcore_ctx)
        results.append((out, {k: g for k, g in grads.items() if ".lora_" in k}))
    (exact, exact_g), (loop, loop_g), (grouped, grouped_g) = results
    err_loop, err_grouped = rel_error(loop, exact), rel_error(grouped, exact)
    print(f"LoRA on experts, bf16 logits rel err vs fp32: sequential {err_loop:.2e}, grouped_mm {err_grouped:.2e}")
    assert err_grouped <= 2 * err_loop + 2e-3
    assert set(grouped_g) == set(exact_g) and any(".local_experts." in k for k in exact_g)
    assert_grads_close(exact_g, loop_g, grouped_g)
