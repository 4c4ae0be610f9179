"""Native decode of a LoRA actor (rollout/merged_weights.py): the static decode step reads the merged weights,
refreshed before each rollout, and megatron's eager path runs the adapters' hooks; both give the trainer's
log-probs (the rollout mismatch of a model without adapters). A decode that ignored the adapters would be far
off (checked, so the test can fail)."""
import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.logprobs import token_logprobs
from rlhf_mcore.models.lora import LoraSettings, adapter_parameters, apply_lora, expand_targets
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout import merged_weights
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.static_decode import StaticDecoder
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config
from tests.unit.rollout.test_static_decode import rollout_gap

SETTINGS = LoraSettings(rank=4, alpha=8.0, target_modules=expand_targets(["all-linear"]))
PARAMS = SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=3)


def lora_actor(ctx, dtype: str, **fields):
    cfg = tiny_model_config(dtype=dtype, **fields)
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx))
    if not hasattr(model, "lora_settings"):  # build applies LoRA only when model.lora_rank is set
        apply_lora(model, SETTINGS, ctx)
    return model.eval()


def update_adapters(model, seed: int, magnitude: float = 0.05) -> None:
    """Stand-in for a few optimizer steps: every A and B moves (B != 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapter_parameters(model):
            p.add_((torch.randn(p.shape, generator=gen) * magnitude).to(p.device, p.dtype))


def gaps(model, ctx, engine, prompts) -> torch.Tensor:
    """|rollout log-prob - trainer log-prob| of every response token (the trainer: one forward per row)."""
    batch = engine.generate(prompts, PARAMS)
    out = []
    with torch.no_grad():
        for i, (p, n) in enumerate(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist())):
            ids = batch.tokens[i:i + 1, :p + n]
            logp, _ = token_logprobs(model, model(ids, torch.arange(p + n)[None], None), ids, ctx.pgs.tp)
            out.append((logp[0, p:] - batch.rollout_logprobs[i, p:p + n]).abs())
    return torch.cat(out)


def engines(model, ctx):
    static = NativeRolloutEngine(model, ctx, pad_id=0)
    static.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False)  # the graphed step, eager
    eager = NativeRolloutEngine(model, ctx, pad_id=0, cuda_graphs=False)  # megatron's modules
    return {"static": static, "eager": eager}


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-5), ("bf16", 2e-3)])
def test_lora_decode_gives_the_trainers_logprobs_across_updates(mcore_ctx, dtype, tol):
    model = lora_actor(mcore_ctx, dtype)
    runs = engines(model, mcore_ctx)
    for seed in (1, 2):  # the second update: the static decoder's merged buffers must follow (refresh)
        update_adapters(model, seed)
        for name, engine in runs.items():
            gap = gaps(model, mcore_ctx, engine, PROMPTS)
            print(f"{dtype} update {seed} {name}: mean {gap.mean():.2e} max {gap.max():.2e}")
            assert gap.mean() < tol, (name, seed, gap.mean())
    assert runs["static"].static.merged.nbytes > 0


def test_a_decode_that_ignored_the_adapters_would_be_far_off(mcore_ctx, monkeypatch):
    model = lora_actor(mcore_ctx, "fp32")
    update_adapters(model, 1)
    monkeypatch.setattr(merged_weights, "adapted_linears", lambda model: set())  # raw weights, as before LoRA
    engine = engines(model, mcore_ctx)["static"]
    assert not engine.static.merged
    assert gaps(model, mcore_ctx, engine, PROMPTS).mean() > 1e-2


def test_release_frees_the_merged_weights_and_the_next_rollout_rebuilds_them(mcore_ctx):
    model = lora_actor(mcore_ctx, "fp32")
    update_adapters(model, 1)
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0, keep_graphs=False)
    engine.static = StaticDecoder(model, lambda: lm_output_weight(model), use_graphs=False)
    gaps(model, mcore_ctx, engine, PROMPTS)
    engine.release_memory()
    assert engine.static.merged.nbytes == 0 and engine.static.weights == []
    engine.resume_memory()
    update_adapters(model, 2)
    assert gaps(model, mcore_ctx, engine, PROMPTS).max() < 1e-4
    assert engine.static.merged.nbytes > 0


@pytest.mark.gpu
@pytest.mark.parametrize("magnitude", [0.0, 0.05, 0.002])
def test_graphed_lora_rollout_logprobs_equal_the_trainers(mcore_ctx, magnitude):
    """bf16, CUDA graphs, ragged prompts: the rollout-vs-trainer gap with merged LoRA weights (adapters moved by
    `magnitude`: large, or small as early in training) against the same model without adapters (0: the
    single-turn level). Printed for benchmarks/, with the rollout's time."""
    import time

    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=3, vocab_size=1000, dtype="bf16")
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    if magnitude:
        apply_lora(model, SETTINGS, mcore_ctx)
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0, decode_attention="sdpa")
    assert engine.static is not None and bool(engine.static.merged) == bool(magnitude)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 60, (48,), generator=g)
    prompts = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in lengths]
    for step in range(3):
        if magnitude:  # the graphs replay over the refreshed merged buffers
            update_adapters(model, 1 + step, magnitude)
        torch.cuda.synchronize()
        start = time.perf_counter()
        batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=160, temperature=1.0, seed=1))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        gap = rollout_gap(model, batch, mcore_ctx.pgs.tp)
        print(f"LORA_GPU magnitude={magnitude} rollout={step}: mean |rollout - trainer| {gap.mean().item():.3e}, "
              f"exact {(gap <= 1e-5).float().mean():.3f}, max {gap.max().item():.3e}, {seconds:.3f} s")
        assert gap.mean() < 3e-3, gap.mean()
