"""LoRA on MoE expert MLPs (models/lora_experts.py): the grouped experts (low-rank grouped GEMMs) and megatron's
SequentialMLP (hooks) give the same logits and adapter gradients; adapters off give the base model; the
expert adapters are expert-parallel parameters seeded by their global expert."""
import dataclasses

import pytest
import torch

from tests.support.tiny_moe import VOCAB, tiny_moe

TOKENS = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(3))


def build(hf_dir, hf_cfg, mcore_ctx, impl: str, targets=("all-linear",), dropout: float = 0.0):
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.build import build_model
    from rlhf_mcore.models.hf_load import load_hf_weights

    model_cfg = dataclasses.replace(ModelConfig(dtype="fp32", attention_backend="sdpa"), moe_expert_impl=impl,
                                    lora_rank=4, lora_alpha=8.0, target_modules=list(targets), lora_dropout=dropout)
    model = build_model("actor", hf_cfg, model_cfg, ParallelConfig(), mcore_ctx)
    load_hf_weights(model, str(hf_dir), hf_cfg, 0, 1)
    return model


def randomize_adapters_(model, seed: int = 5) -> None:
    from rlhf_mcore.models.lora import adapter_parameters

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # as after some updates: B != 0
        for _, p in adapter_parameters(model):
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def forward(model, mcore_ctx):
    from rlhf_mcore.models.logprobs import full_logits

    pos = torch.arange(TOKENS.size(1)).unsqueeze(0).expand_as(TOKENS)
    return full_logits(model, model(TOKENS, pos, None), mcore_ctx.pgs.tp)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from rlhf_mcore.models.hf_io import read_hf_config

    path = tmp_path_factory.mktemp("lora_moe")
    tiny_moe(norm_topk_prob=True).save_pretrained(str(path))
    return path, read_hf_config(path)


def test_expert_adapters_are_expert_parallel_and_seeded_per_expert(moe_dir, mcore_ctx, caplog):
    from rlhf_mcore.models.lora import adapter_parameters, trainable_names

    model = build(*moe_dir, mcore_ctx, "sequential")
    names = dict(adapter_parameters(model))
    a0 = names["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.lora_A.gate_proj"]
    a1 = names["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.lora_A.gate_proj"]
    b0 = names["decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.lora_B.down_proj"]
    up = names["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.lora_B.up_proj"]
    assert a0.shape == (4, 64) and b0.shape == (64, 4) and up.shape == (32, 4)
    assert not torch.equal(a0, a1) and not b0.any()
    assert a0.allreduce is False and b0.allreduce is False  # megatron's DDP reduces them over expert-DP
    assert a0.tensor_model_parallel  # counted on every rank by the grad norm, as the experts' weights
    assert names["decoder.layers.0.self_attention.linear_qkv.lora_A.q_proj"].__dict__.get("allreduce", True)
    experts = [n for n in trainable_names(model) if ".local_experts." in n]
    assert len(experts) == 2 * 8 * 3 * 2  # layers x experts x (gate, up, down) x (A, B)
    only_down = build(*moe_dir, mcore_ctx, "sequential", targets=("q_proj", "down_proj"))
    assert "peft" not in caplog.text
    build(*moe_dir, mcore_ctx, "sequential", targets=("q_proj", "gate_proj"))
    assert "adapted but not their up_proj" in caplog.text and "Add up_proj to model.target_modules" in caplog.text
    assert not [n for n in trainable_names(only_down) if "linear_fc1" in n]
    assert [n for n in trainable_names(only_down) if "linear_fc2.lora_A.down_proj" in n]


@pytest.mark.parametrize("targets,subs", [(("all-linear",), 3), (("q_proj", "up_proj", "down_proj"), 2)])
def test_grouped_experts_with_adapters_equal_sequential_logits_and_gradients(moe_dir, mcore_ctx, targets, subs):
    """The grouped experts' low-rank LoRA GEMMs (lora_experts.grouped_lora_term) against megatron's loop with
    the hooks, with every projection adapted and with gate_proj not (its part of linear_fc1 zero)."""
    from rlhf_mcore.models.lora import adapter_parameters, adapters_disabled

    models = {impl: build(*moe_dir, mcore_ctx, impl, targets) for impl in ("sequential", "grouped-reference")}
    logits, grads = {}, {}
    for impl, model in models.items():
        randomize_adapters_(model)
        out = forward(model, mcore_ctx)
        out.log_softmax(-1)[..., 7].sum().backward()
        logits[impl] = out.detach()
        grads[impl] = {n: p.grad for n, p in adapter_parameters(model)}
        with torch.no_grad(), adapters_disabled(model):
            logits[f"{impl} off"] = forward(model, mcore_ctx)
    err = (logits["sequential"] - logits["grouped-reference"]).abs().max().item()
    effect = (logits["sequential"] - logits["sequential off"]).abs().max().item()
    print(f"grouped - sequential {err:.2e}, adapters' effect {effect:.2e}")
    assert err < 1e-5 and effect > 0.05
    assert torch.equal(logits["sequential off"], logits["grouped-reference off"])
    moved = [bool(g.any()) for k, g in grads["sequential"].items() if ".local_experts." in k and "lora_B" in k]
    assert len(moved) == 2 * 8 * subs and sum(moved) >= 12 * subs, moved  # an expert no token chose gets no gradient
    for key, want in grads["sequential"].items():
        got = grads["grouped-reference"][key]
        assert torch.allclose(want, got, atol=1e-5, rtol=1e-4), (key, (want - got).abs().max().item())


def test_lora_dropout_drops_the_expert_adapters_input_in_both_implementations(moe_dir, mcore_ctx):
    """model.lora_dropout on the experts too (peft's per-expert modules drop their input): only the adapters see
    it, in training forwards with gradients, in the loop's hooks and the grouped experts' low-rank GEMMs alike.
    Attention adapters off (target_modules: the experts' projections), so any change comes from the experts."""
    from rlhf_mcore.models.lora import adapters_disabled

    experts_only = ("gate_proj", "up_proj", "down_proj")
    for impl in ("sequential", "grouped-reference"):
        model = build(*moe_dir, mcore_ctx, impl, experts_only, dropout=0.5)
        randomize_adapters_(model)
        model.train()
        with torch.no_grad():
            frozen = forward(model, mcore_ctx)  # no gradients: no dropout
            with adapters_disabled(model):
                base = forward(model, mcore_ctx)
        torch.manual_seed(0)
        dropped = forward(model, mcore_ctx).detach()
        torch.manual_seed(1)
        other = forward(model, mcore_ctx).detach()
        effect = (frozen - base).abs().max().item()
        moved = (dropped - frozen).abs().max().item()
        print(f"{impl}: adapters' effect {effect:.2e}, dropout's {moved:.2e}")
        assert effect > 0.05 and moved > 0.05 * effect, impl  # the experts' adapters see the dropout
        assert not torch.equal(dropped, other)  # a fresh mask per forward


def test_expert_adapters_export_to_peft_and_merged_weights_and_load_back(moe_dir, mcore_ctx, tmp_path):
    """The PEFT adapter (per-expert modules, as transformers 4 names them) loads with peft onto transformers 5's
    fused experts and gives the trainer's logits; so does the merged export; an actor started from the adapter
    (sequential experts this time) gives them too."""
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlhf_mcore.models.full_weights import FullWeights, hf_weights
    from rlhf_mcore.models.hf_io import save_hf_checkpoint
    from rlhf_mcore.models.lora_export import adapter_config, load_peft_adapter, lora_state_for_hf, save_peft_adapter

    hf_dir, hf_cfg = moe_dir
    model = build(hf_dir, hf_cfg, mcore_ctx, "grouped-reference").eval()
    randomize_adapters_(model)
    with torch.no_grad():
        ours = forward(model, mcore_ctx)
    state = lora_state_for_hf(model, hf_cfg, mcore_ctx)
    assert state["base_model.model.model.layers.1.mlp.experts.7.up_proj.lora_B.weight"].shape == (32, 4)
    assert len([k for k in state if ".experts." in k]) == 2 * 8 * 3 * 2
    config = adapter_config(model.lora_settings, str(hf_dir))
    save_peft_adapter(tmp_path / "peft", state, config)
    save_hf_checkpoint(tmp_path / "merged", dict(hf_weights(FullWeights(model, mcore_ctx), hf_cfg)), hf_cfg)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        plain = base(TOKENS).logits
        peft = PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()(TOKENS).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
        merged = merged(TOKENS).logits
    errors = {"peft": (peft - ours).abs().max().item(), "merged": (merged - ours).abs().max().item(),
              "effect": (plain - ours).abs().max().item()}
    print(errors)
    assert errors["peft"] < 1e-4 and errors["merged"] < 1e-4 and errors["effect"] > 0.05, errors

    fresh = build(hf_dir, hf_cfg, mcore_ctx, "sequential").eval()
    load_peft_adapter(fresh, str(tmp_path / "peft"), hf_cfg, mcore_ctx)
    with torch.no_grad():
        assert (forward(fresh, mcore_ctx) - ours).abs().max().item() < 1e-5


def test_budget_counts_the_built_adapters_and_the_plan_splits_experts_over_ep(moe_dir, mcore_ctx):
    """models.lora_budget's count is the built model's (experts included, at their own width), and the memory
    plan puts 1/ep of the expert adapters on a rank, their optimizer state over expert-DP."""
    from rlhf_mcore.models.lora import adapter_parameters, expand_targets
    from rlhf_mcore.models.lora_budget import lora_param_count
    from rlhf_mcore.models.weights import model_dims
    from rlhf_mcore.plan.params import Shape
    from rlhf_mcore.plan.static import Layout, Role, stage_bytes

    hf_dir, hf_cfg = moe_dir
    built = sum(p.numel() for _, p in adapter_parameters(build(hf_dir, hf_cfg, mcore_ctx, "sequential")))
    dims = model_dims(hf_cfg, "config.json")
    assert lora_param_count(dims, 4, expand_targets(["all-linear"]), moe=True) == built
    mlp = lora_param_count(dims, 4, ("gate_proj", "up_proj", "down_proj"), moe=True)
    assert mlp == 2 * 8 * 4 * (3 * 64 + 3 * 32)  # layers x experts x r x (in + out of gate, up, down)
    role = Role("adapters", trained=True, whole=built, whole_experts=mlp)
    at = {ep: stage_bytes(Shape.of(hf_cfg), Layout(1, 1, ep, 2), 0, [role], "fp32", True)["adapters"]
          for ep in (1, 2)}
    dense = built - mlp
    assert at[2]["weights"] == 4 * (dense + mlp // 2) and at[1]["weights"] == 4 * built
    assert at[2]["optimizer"] == 8 * dense // 2 + 8 * mlp // 2  # dense over dp 2; experts' expert-DP is 1 at ep 2
    assert at[1]["optimizer"] == 8 * built // 2


def test_a_checkpoint_holds_the_expert_adapters_and_exports_them(moe_dir, mcore_ctx, tmp_path):
    """The dist-checkpoint of a LoRA MoE actor saves the expert adapters (megatron's expert sharding of
    SequentialMLP's state dict); the HF export loads them back and writes the merged model and the adapter."""
    pytest.importorskip("peft")
    from types import SimpleNamespace

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlhf_mcore.checkpoint import save_checkpoint
    from rlhf_mcore.config import Config, ModelConfig
    from rlhf_mcore.convert.export import export_actor_to_hf
    from rlhf_mcore.models.lora_export import ADAPTER_DIR
    from rlhf_mcore.trainer.optim import build_train_state

    hf_dir, hf_cfg = moe_dir
    model = build(hf_dir, hf_cfg, mcore_ctx, "sequential").eval()
    randomize_adapters_(model, seed=9)
    with torch.no_grad():
        ours = forward(model, mcore_ctx)
    cfg = Config(model=ModelConfig(hf_path=str(hf_dir), lora_rank=4, lora_alpha=8.0, attention_backend="sdpa"))
    path = save_checkpoint(tmp_path / "run", 1, {"actor": build_train_state(model, cfg.actor.optim, cfg.parallel)},
                           {}, mcore_ctx)
    out = export_actor_to_hf(SimpleNamespace(cfg=cfg, run_dir=str(tmp_path / "run")), path)
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()(TOKENS).logits
        base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(base, f"{out}/{ADAPTER_DIR}").eval()(TOKENS).logits
    assert (merged - ours).abs().max().item() < 1e-4 and (peft - ours).abs().max().item() < 1e-4


def test_fused_expert_adapters_round_trip_and_a_fused_trained_one_is_refused():
    """Qwen3-VL-MoE's fused layout (`fuse_expert_state`): gate and up become one block-diagonal rank-2r
    gate_up_proj adapter per expert, stacked as peft stacks them; `unfuse_expert_state` gives ours back, and
    refuses a fused adapter with weight off the diagonal blocks (trained as one: not two rank-r adapters)."""
    from rlhf_mcore.models.lora_experts import fuse_expert_state, fused_key, unfuse_expert_state

    gen = torch.Generator().manual_seed(0)
    module = "base_model.model.model.language_model.layers.0.mlp.experts"
    shapes = {"gate_proj": ((2, 6), (5, 2)), "up_proj": ((2, 6), (5, 2)), "down_proj": ((2, 5), (6, 2))}
    ours = {f"{module}.{e}.{s}.lora_{ab}.weight": torch.randn(*shape, generator=gen)
            for e in range(3) for s, (a, b) in shapes.items() for ab, shape in (("A", a), ("B", b))}
    ours["base_model.model.x.lora_A.weight"] = torch.ones(1)
    targets = ("q_proj", "gate_proj", "up_proj", "down_proj")
    fused = fuse_expert_state(ours, targets)
    params = ("gate_up_proj", "down_proj")
    a, b = fused[fused_key(module, params, "gate_up_proj", "A")], fused[fused_key(module, params, "gate_up_proj", "B")]
    assert a.shape == (3 * 4, 6) and b.shape == (10, 4 * 3) and fused[f"{module}.lora_A.weight"].shape == (3 * 2, 5)
    for e in range(3):  # peft's delta of expert e: B.reshape(out, R, E)[..., e] @ A.reshape(E, R, in)[e]
        delta = b.reshape(10, 4, 3)[..., e] @ a.reshape(3, 4, 6)[e]
        want = torch.cat([ours[f"{module}.{e}.{s}.lora_B.weight"] @ ours[f"{module}.{e}.{s}.lora_A.weight"]
                          for s in ("gate_proj", "up_proj")])
        assert torch.allclose(delta, want, atol=1e-6)
    back = unfuse_expert_state(fused, targets, 2, 3, "adapter_model.safetensors")
    assert back.keys() == ours.keys() and all(torch.equal(back[k], v) for k, v in ours.items())
    b[0, -1] = 1.0  # gate's rows, up's rank columns
    with pytest.raises(ValueError, match="is not block-diagonal over gate_proj, up_proj at rank 2"):
        unfuse_expert_state(fused, targets, 2, 3, "adapter_model.safetensors")
