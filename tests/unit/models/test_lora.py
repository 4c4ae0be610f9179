"""LoRA adapters (rlhf_mcore.models.lora) on one rank: identity at init, the merged weight against the adapter
forward, the reference (adapters off) against the frozen base, what an update changes, and the config keys."""
import dataclasses
from functools import partial

import pytest
import torch

from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.lora import (
    AdaptersOff,
    LoraSettings,
    adapter_parameters,
    adapters_disabled,
    effective_weight,
    expand_targets,
    is_lora_model,
    lora_delta,
    lora_linears,
)
from rlhf_mcore.models.lora_budget import lora_budget, lora_param_count
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.optim import build_train_state, optimizer_step, zero_grads
from rlhf_mcore.trainer.schedule import forward_collect, run_schedule, split_micro_batches
from tests.support.tiny import tiny_model_config
from tools.check_layouts import synthetic_batch


def lora_cfg(rank=8, targets=("all-linear",), **model):
    cfg = tiny_model_config(**model)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=rank, lora_alpha=16.0,
                                                              target_modules=list(targets)))


def logits(model, tokens):  # [b, s, V/tp]: the LM head over the final hidden states
    pos = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    return model(tokens, pos, None) @ lm_output_weight(model).t()


def build(cfg, ctx, role="actor"):
    return build_model(role, load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)


@torch.no_grad()
def perturb(model, std=0.02, seed=5):
    """Random B (and A) so the adapters change the output (B is zero at init)."""
    g = torch.Generator().manual_seed(seed)
    for _, p in adapter_parameters(model):
        p.add_(torch.randn(p.shape, generator=g) * std)


TOKENS = torch.randint(0, 250, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_identity_at_init_is_bitwise(mcore_ctx, dtype):
    base = build(tiny_model_config(dtype=dtype), mcore_ctx)
    lora = build(lora_cfg(dtype=dtype), mcore_ctx)
    assert is_lora_model(lora) and not is_lora_model(base)
    assert torch.equal(logits(lora, TOKENS), logits(base, TOKENS))
    names = {n for n, _ in adapter_parameters(lora)}
    layer0 = {n.split("decoder.layers.0.")[1] for n in names if n.startswith("decoder.layers.0.")}
    assert layer0 == {f"self_attention.linear_qkv.lora_{m}.{p}" for m in "AB" for p in ("q_proj", "k_proj", "v_proj")} \
        | {f"self_attention.linear_proj.lora_{m}.o_proj" for m in "AB"} \
        | {f"mlp.linear_fc1.lora_{m}.{p}" for m in "AB" for p in ("gate_proj", "up_proj")} \
        | {f"mlp.linear_fc2.lora_{m}.down_proj" for m in "AB"}
    assert {n for n, p in lora.named_parameters() if p.requires_grad} == names
    assert all(not p.any() for n, p in adapter_parameters(lora) if ".lora_B." in n)


def test_merged_weight_equals_the_adapter_forward(mcore_ctx):
    lora = build(lora_cfg(), mcore_ctx)
    perturb(lora)
    merged = build(tiny_model_config(), mcore_ctx)
    with torch.no_grad():
        for name, module in lora.named_modules():
            if hasattr(module, "lora_A"):
                merged.get_submodule(name).weight.copy_(effective_weight(module))
    got, want = logits(merged, TOKENS), logits(lora, TOKENS)
    assert (want - logits(build(tiny_model_config(), mcore_ctx), TOKENS)).abs().max() > 1e-3  # adapters matter
    assert (got - want).abs().max() < 1e-6


def test_delta_follows_the_fused_qkv_and_fc1_layouts(mcore_ctx):
    """lora_delta is scale * B @ A of each sub-projection, put where weights.hf_to_mcore puts that projection."""
    from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf

    cfg = lora_cfg(targets=("q_proj", "v_proj", "up_proj"))
    lora = build(cfg, mcore_ctx)
    perturb(lora)
    hf = load_hf_config(cfg.model)
    full = {k: torch.zeros_like(v) for k, v in lora.state_dict().items() if "lora_" not in k and "extra" not in k}
    for name, module in lora.named_modules():
        if hasattr(module, "lora_A"):
            full[f"{name}.weight"] = lora_delta(module)
    deltas = mcore_to_hf(full, hf, role="actor")
    attn, mlp = lora.decoder.layers[1].self_attention.linear_qkv, lora.decoder.layers[1].mlp.linear_fc1
    expect = {"q_proj": attn, "v_proj": attn, "up_proj": mlp}
    for proj, linear in expect.items():
        key = f"model.layers.1.{'mlp' if proj == 'up_proj' else 'self_attn'}.{proj}.weight"
        want = 2.0 * linear.lora_B[proj] @ linear.lora_A[proj]  # alpha 16 / rank 8
        assert torch.allclose(deltas[key], want, atol=1e-7)
    for zero in ("self_attn.k_proj", "mlp.gate_proj", "self_attn.o_proj", "mlp.down_proj"):
        assert not deltas[f"model.layers.1.{zero}.weight"].any()
    assert set(hf_to_mcore(deltas, hf, role="actor")) >= {"decoder.layers.1.self_attention.linear_qkv.weight"}


def test_reference_is_the_frozen_base_exactly(mcore_ctx):
    lora, base = build(lora_cfg(), mcore_ctx), build(tiny_model_config(), mcore_ctx)
    perturb(lora)
    with adapters_disabled(lora):
        off = logits(lora, TOKENS)
    assert torch.equal(off, logits(base, TOKENS))
    ref = AdaptersOff(lora)
    pos = torch.arange(12).unsqueeze(0).expand_as(TOKENS)
    assert list(ref.parameters()) == [] and ref.config is lora.config
    assert torch.equal(ref(TOKENS, pos, None) @ lm_output_weight(ref).t(), off)
    assert not torch.equal(logits(lora, TOKENS), off)  # the adapters are back on after the context


def _train(state, cfg, ctx, steps):
    batch = synthetic_batch(8, 16, 250, seed=3)
    fn = partial(actor_loss, model=state.module, tp_group=ctx.pgs.tp, actor_cfg=cfg.actor, temperature=1.0,
                 norm_length=16.0)
    mbs = split_micro_batches(batch, micro_batch_size=4)
    before = forward_collect(state.model, mbs, fn, ("logp",), 16, ctx.pgs.pp)["logp"]
    mbs = split_micro_batches({**batch, "old_logp": before + 0.1 * batch["nudge"] * batch["response_mask"]},
                              micro_batch_size=4)
    for _ in range(steps):
        zero_grads(state)
        run_schedule(state.model, mbs, fn, forward_only=False)
        applied, _ = optimizer_step(state, 1e-2)
        assert applied


def test_a_step_changes_only_adapters(mcore_ctx):
    cfg = lora_cfg()
    state = build_train_state(build(cfg, mcore_ctx), cfg.actor.optim, cfg.parallel)
    model = state.module
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimized = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for _, p in adapter_parameters(model)}  # megatron's optimizer: adapters only
    _train(state, cfg, mcore_ctx, steps=2)
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        assert changed == (".lora_" in name), name  # every adapter moved (A too, by step 2); the base is bitwise kept


def test_critic_lora_keeps_its_fresh_head_trainable(mcore_ctx):
    cfg = lora_cfg()
    critic = build_model("critic", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx,
                         lora=LoraSettings.from_model_cfg(cfg.model, rank=4))
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert "output_layer.weight" in trainable and all(".lora_" in n for n in trainable - {"output_layer.weight"})
    assert critic.decoder.layers[0].self_attention.linear_proj.lora_A["o_proj"].shape == (4, 64)
    with pytest.raises(ValueError, match="frozen role 'ref'"):
        build_model("ref", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx,
                    lora=LoraSettings.from_model_cfg(cfg.model))


def test_trainable_count_matches_the_budget(mcore_ctx):
    cfg = lora_cfg(targets=("q_proj", "o_proj", "down_proj"))
    model = build(cfg, mcore_ctx)
    hf = load_hf_config(cfg.model)
    settings = LoraSettings.from_model_cfg(cfg.model)
    count = sum(p.numel() for _, p in adapter_parameters(model))
    assert count == lora_budget(hf, settings, "fp32").trainable == 2 * 8 * ((64 + 64) * 2 + (64 + 128))
    assert len(list(lora_linears(model))) == 2 * 3
    dims = {"layers": 2, "h": 64, "q": 64, "kv": 32, "ffn": 128}
    assert lora_param_count(dims, 8, expand_targets("all-linear")) == count + 2 * 8 * (2 * (64 + 32) + 2 * 192)


def test_config_keys_are_checked_and_verl_names_translate():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.lora_rank=-1", "model.lora_alpha=0", "model.lora_dropout=1.0",
                           "model.target_modules=[q_prj]"])
    errors = "\n".join(info.value.errors)
    for text in ("model.lora_rank: must be >= 0 (got -1)", "model.lora_alpha: must be > 0 (got 0.0)",
                 "model.lora_dropout: must be in [0.0, 1.0) (got 1.0)",
                 "model.target_modules: unknown module 'q_prj' (got ['q_prj']). Did you mean 'q_proj'?"):
        assert text in errors
    cfg = load_config(None, ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=64",
                             "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "critic.model.lora_rank=8"],
                      check=False)
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.target_modules, cfg.critic.lora_rank) == (
        32, 64.0, ["q_proj", "v_proj"], 8)
    assert LoraSettings.from_model_cfg(cfg.model).target_modules == ("q_proj", "v_proj")
    assert LoraSettings.from_model_cfg(load_config(None, [], check=False).model) is None
