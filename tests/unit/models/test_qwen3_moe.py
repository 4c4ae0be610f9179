"""Qwen3-MoE and Mixtral (models/families/qwen3_moe.py, mixtral.py) on megatron-core's MoE layer (SequentialMLP
experts, no TE): random tiny HF models against ours (fp32 logits within 1e-4 at EP1; EP2 in
tests/dist/models/test_hf_layouts.py), Qwen3-MoE with norm_topk_prob both ways, the converter's round trip
bitwise, the EP checks before build."""
import pytest
import torch

from rlhf_mcore.models.hf_load import load_hf_weights
from rlhf_mcore.models.weights import hf_to_mcore, mcore_to_hf
from tests.support.tiny_hf import max_logit_error
from tests.support.tiny_moe import VOCAB, tiny_mixtral, tiny_moe


@pytest.mark.parametrize("norm_topk_prob", [True, False, "mixtral"])
def test_logits_match_transformers_at_ep1(tmp_path, mcore_ctx, norm_topk_prob):
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config

    hf = tiny_mixtral() if norm_topk_prob == "mixtral" else tiny_moe(norm_topk_prob)
    hf.save_pretrained(str(tmp_path))
    hf_cfg = read_hf_config(tmp_path)
    ours = build_for_conversion(hf_cfg, "actor", mcore_ctx, "fp32")
    load_hf_weights(ours, str(tmp_path), hf_cfg, 0, 1)
    ours.eval()
    assert ours.config.num_moe_experts == 8 and ours.config.moe_router_pre_softmax is (norm_topk_prob is False)
    err = max_logit_error(hf, ours, mcore_ctx.pgs.tp, VOCAB)
    print(f"moe {hf.config.model_type} norm_topk_prob={norm_topk_prob} ep1 logits max |ours - hf| = {err:.2e}")
    assert err <= 1e-4


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_converter_round_trip_is_bitwise(tmp_path, family):
    from rlhf_mcore.models.hf_io import load_hf_state_dict, read_hf_config

    (tiny_mixtral() if family == "mixtral" else tiny_moe(True)).save_pretrained(str(tmp_path))
    sd, config = load_hf_state_dict(tmp_path)[0], read_hf_config(tmp_path)
    mcore = hf_to_mcore(sd, config)
    assert mcore["decoder.layers.1.mlp.experts.local_experts.7.linear_fc1.weight"].shape == (64, 64)  # 2 x 32
    back = mcore_to_hf(mcore, config)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_unsupported_moe_layouts_are_named():
    from rlhf_mcore.models.families.qwen3_moe import check

    with pytest.raises(ValueError, match="mlp_only_layers"):
        check({"decoder_sparse_step": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 8}, "x")


def test_expert_parallel_checks_before_build(tmp_path):
    import json
    import os

    from rlhf_mcore.config.load import ConfigError, load_config
    from tests.support.paths import ROOT

    tiny = os.path.join(ROOT, "configs", "tiny_grpo.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(tiny, ["parallel.ep=2"], world_size=2)
    assert any(e.startswith("parallel.ep: must divide the experts of an MoE model (this model is dense)")
               for e in info.value.errors)
    tiny_moe(True).config.to_json_file(str(tmp_path / "config.json"))
    blank = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                         "num_query_groups", "vocab_size")]
    with pytest.raises(ConfigError) as info:
        load_config(tiny, blank + [f"model.hf_path={tmp_path}", "parallel.ep=3"], world_size=3)
    assert "parallel.ep: must divide the expert count 8 (got 3). Pick a divisor of num_experts, or ep=1." in \
        info.value.errors
    with pytest.raises(ConfigError) as info:
        load_config(tiny, blank + [f"model.hf_path={tmp_path}", "parallel.ep=4"], world_size=2)
    assert "parallel.ep: must divide tp*dp = world / pp = 2 (got ep=4). Launch a multiple of pp*ep ranks, or pick " \
        "a divisor." in info.value.errors
    assert json.loads((tmp_path / "config.json").read_text())["num_local_experts"] == 8
    load_config(tiny, blank + [f"model.hf_path={tmp_path}", "parallel.ep=2", "rollout.mode=multi_turn",
                               "rollout.multi_turn.tools=[calculator]"], world_size=2)  # EP ranks agree per turn
    load_config(tiny, blank + [f"model.hf_path={tmp_path}", "parallel.ep=2"], world_size=2)  # single_turn: fine
    from rlhf_mcore.parallel import ParallelDims

    sp = ["parallel.tp=2", "parallel.sequence_parallel=true"]  # expert groups across TP ranks (SGLang rolls out
    for ep, world in ((2, 2), (4, 4), (8, 8)):  # at tp > 1 with sequence parallelism: the CPU has no SGLang)
        with pytest.raises(ConfigError) as info:
            load_config(tiny, blank + [f"model.hf_path={tmp_path}", f"parallel.ep={ep}"] + sp, world_size=world)
        assert [e for e in info.value.errors if e.startswith("parallel.ep")] == [], info.value.errors
        assert ParallelDims.from_world(world, 2, 1, ep=ep) == ParallelDims(tp=2, pp=1, dp=world // 2, ep=ep)
    assert ParallelDims.from_world(8, 4, 1, ep=8).dp == 2  # slime's Qwen3-30B-A3B layout on 8 GPUs
    with pytest.raises(ValueError, match=r"parallel.ep: must divide tp\*dp = world / pp = 4 \(got 8\)"):
        ParallelDims.from_world(8, 2, 2, ep=8)


def test_router_losses_are_config_keys_default_off():
    from rlhf_mcore.config.schema import ModelConfig, ParallelConfig
    from rlhf_mcore.models.transformer_config import to_transformer_config

    hf = tiny_moe(True).config.to_dict()
    off = to_transformer_config(hf, ModelConfig(), ParallelConfig())
    assert off.moe_router_load_balancing_type == "none" and off.moe_aux_loss_coeff == 0 and not off.moe_z_loss_coeff
    on = to_transformer_config(hf, ModelConfig(moe_aux_loss_coeff=0.01, moe_z_loss_coeff=1e-3), ParallelConfig())
    assert (on.moe_router_load_balancing_type, on.moe_aux_loss_coeff, on.moe_z_loss_coeff) == ("aux_loss", 0.01, 1e-3)
    assert not on.moe_router_enable_expert_bias  # no expert bias to update: nothing drifts during RL


def test_native_engine_decodes_moe_eagerly_and_says_why(tmp_path, mcore_ctx):
    """The static decoder's functional layer has dense MLPs: the family lists only 'eager', graph_blockers says
    so (the engine logs it and decodes through megatron's modules); eager decode equals the trainer's forward."""
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.logprobs import token_logprobs
    from rlhf_mcore.rollout.native import NativeRolloutEngine
    from rlhf_mcore.rollout.static_decode import graph_blockers
    from rlhf_mcore.rollout.types import SamplingParams

    tiny_moe(True).save_pretrained(str(tmp_path))
    hf_cfg = read_hf_config(tmp_path)
    ours = build_for_conversion(hf_cfg, "actor", mcore_ctx, "fp32")
    load_hf_weights(ours, str(tmp_path), hf_cfg, 0, 1)
    ours.eval()
    assert "model family qwen3_moe (its ModelSpec.decode_paths lacks 'static')" in graph_blockers(ours, mcore_ctx)
    batch = NativeRolloutEngine(ours, mcore_ctx, pad_id=0).generate(
        [[3, 4, 5, 6], [7, 8]], SamplingParams(n=1, max_new_tokens=5, temperature=0.0))
    with torch.no_grad():
        pos = torch.arange(batch.tokens.size(1))[None].expand_as(batch.tokens)
        logp, _ = token_logprobs(ours, ours(batch.tokens, pos, None), batch.tokens, mcore_ctx.pgs.tp)
    cols = torch.arange(batch.tokens.size(1))[None]
    start = batch.prompt_lengths[:, None]
    mask = (cols >= start) & (cols < start + batch.response_lengths[:, None])
    assert mask.sum() == 2 * 5 and (logp - batch.rollout_logprobs).abs()[mask].max() <= 1e-5


@pytest.mark.parametrize("layout", ["hub", "transformers"])
def test_a_qwen3_moe_checkpoint_with_fused_experts_loads_the_same_weights(tmp_path, layout):
    """Qwen3-MoE's experts stored fused (`mlp.experts.gate_up_proj` / `down_proj`, as transformers 5 holds them, or
    transposed as Qwen3-VL-MoE's Hub files are): the checkpoint reader lists them per expert (models/fused_experts.py),
    so the converter gives bitwise the weights of the per-expert checkpoint, and the export writes Qwen3-MoE's own
    per-expert names back."""
    from safetensors.torch import save_file

    from rlhf_mcore.models.hf_io import load_hf_state_dict, read_hf_config

    tiny_moe(True).save_pretrained(str(tmp_path / "per_expert"))
    sd, config = load_hf_state_dict(tmp_path / "per_expert")[0], read_hf_config(tmp_path / "per_expert")
    fused = {k: v for k, v in sd.items() if ".experts." not in k}
    for i in range(2):
        p = f"model.layers.{i}.mlp.experts."
        gate_up = torch.stack([torch.cat([sd[f"{p}{e}.gate_proj.weight"], sd[f"{p}{e}.up_proj.weight"]])
                               for e in range(8)])  # [E, 2I, H]
        down = torch.stack([sd[f"{p}{e}.down_proj.weight"] for e in range(8)])  # [E, H, I]
        hub = layout == "hub"
        fused[p + "gate_up_proj"] = gate_up.transpose(1, 2).contiguous() if hub else gate_up
        fused[p + "down_proj"] = down.transpose(1, 2).contiguous() if hub else down
    (tmp_path / "fused").mkdir()
    save_file(fused, str(tmp_path / "fused" / "model.safetensors"))
    (tmp_path / "fused" / "config.json").write_text((tmp_path / "per_expert" / "config.json").read_text())
    from_fused = hf_to_mcore(load_hf_state_dict(tmp_path / "fused")[0], config)
    want = hf_to_mcore(sd, config)
    assert from_fused.keys() == want.keys() and all(torch.equal(from_fused[k], want[k]) for k in want)
    back = mcore_to_hf(from_fused, config)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
