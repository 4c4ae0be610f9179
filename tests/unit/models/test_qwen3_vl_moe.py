"""Qwen3-VL-MoE (models/families/qwen3_vl_moe.py, models/fused_experts.py): a tiny random HF
`Qwen3VLMoeForConditionalGeneration` loads from its fused experts in either layout (the Hub's [E, H, 2I] / [E, I, H],
and transformers 5's [E, 2I, H] / [E, H, I]) into the same parameters, with transformers' logits with images (fp32,
TP1, within 1e-5); each expert's megatron weights are transformers' expert slices; the router renormalises its top-k
whatever config.json says; SGLang's start-up directory holds the Hub's layout, which SGLang's loader (as written in
0.5.17) splits back into our experts, and the interleaved M-RoPE its config class reads; a fused pair of neither
layout, and what neither half supports, are refused."""
import json

import pytest
import torch
from safetensors.torch import load_file

from tests.support.tiny_vl import (
    PATCH_DIM3,
    image_batch,
    logits_error,
    save_tiny_family,
    tiny_vl3_moe_model,
    vision_lm_tp1,
)

GATE_UP = "model.language_model.layers.{i}.mlp.experts.gate_up_proj"
DOWN = "model.language_model.layers.{i}.mlp.experts.down_proj"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_vl_moe")
    return {"hub": save_tiny_family("qwen3_vl_moe", root / "hub"),
            "transformers": save_tiny_family("qwen3_vl_moe", root / "transformers", hub_layout=False)}


@pytest.fixture(scope="module")
def ours(dirs, mcore_ctx):
    return {layout: vision_lm_tp1(d, mcore_ctx) for layout, d in dirs.items()}


def test_the_two_layouts_differ_on_disk(dirs):
    hub, mine = load_file(str(dirs["hub"] / "model.safetensors")), load_file(str(dirs["transformers"] /
                                                                                 "model.safetensors"))
    assert list(hub[GATE_UP.format(i=0)].shape) == [4, 64, 96] and list(hub[DOWN.format(i=0)].shape) == [4, 48, 64]
    assert list(mine[GATE_UP.format(i=0)].shape) == [4, 96, 64] and list(mine[DOWN.format(i=0)].shape) == [4, 64, 48]


@pytest.mark.parametrize("layout", ["hub", "transformers"])
def test_logits_match_transformers_with_images_at_tp1(dirs, ours, mcore_ctx, layout):
    err, _, _ = logits_error(dirs[layout], ours[layout], image_batch(patch_dim=PATCH_DIM3), mcore_ctx.pgs.tp)
    print(f"qwen3-vl-moe ({layout} layout) tp1 logits max |ours - transformers| = {err:.2e}")
    assert err <= 1e-5
    assert len(ours[layout].lm.vision.hooks) == 2  # DeepStack into LM layers 0 and 1, as the dense family


def test_both_layouts_load_the_same_parameters_and_transformers_experts(ours):
    hub, mine = (dict(ours[k].lm.named_parameters()) for k in ("hub", "transformers"))
    assert hub.keys() == mine.keys() and all(torch.equal(hub[k], mine[k]) for k in hub)
    experts = tiny_vl3_moe_model().model.language_model.layers[1].mlp.experts  # [E, 2I, H] gate first, [E, H, I]
    for e in range(4):
        fc1 = hub[f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc1.weight"]
        fc2 = hub[f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc2.weight"]
        assert torch.equal(fc1, experts.gate_up_proj[e]) and torch.equal(fc2, experts.down_proj[e])


def test_the_router_renormalises_its_top_k_whatever_config_json_says(dirs):
    from rlhf_mcore.models.families import qwen3_vl_moe

    hf = qwen3_vl_moe.SPEC.text_config(json.loads((dirs["hub"] / "config.json").read_text()))
    for norm in (True, False, None):  # transformers' router has no such switch; Qwen3-MoE's reads it
        fields = qwen3_vl_moe.config_fields({**hf, "norm_topk_prob": norm})
        assert fields["moe_router_pre_softmax"] is False and fields["moe_router_topk"] == 2
    assert fields["num_moe_experts"] == 4 and fields["moe_ffn_hidden_size"] == 48 and fields["qk_layernorm"]


def sglang_splits(fused_gate_up: torch.Tensor, fused_down: torch.Tensor):
    """SGLang 0.5.17's `Qwen3VLMoeForConditionalGeneration.load_weights` on fused experts, as written there:
    `loaded_weight.transpose(-1, -2)`, then gate_up `.chunk(2, dim=-2)` into w1 (gate) and w3 (up); down whole (w2)."""
    gate, up = fused_gate_up.transpose(-1, -2).chunk(2, dim=-2)
    return gate, up, fused_down.transpose(-1, -2)


def test_sglangs_start_directory_holds_the_hub_layout_it_reads(dirs, ours, tmp_path):
    from rlhf_mcore.models.weights import iter_mcore_to_hf
    from rlhf_mcore.rollout.sglang_engine import write_hf_dir

    hf = json.loads((dirs["hub"] / "config.json").read_text())
    lm = {k: v.detach() for k, v in ours["hub"].lm.state_dict().items() if not k.endswith("_extra_state")
          and not k.startswith("vision")}
    path = write_hf_dir(iter_mcore_to_hf(lm, hf), hf, torch.float32)
    written, source = load_file(f"{path}/model.safetensors"), load_file(str(dirs["hub"] / "model.safetensors"))
    for i in range(4):
        gate_up, down = written[GATE_UP.format(i=i)], written[DOWN.format(i=i)]
        assert torch.equal(gate_up, source[GATE_UP.format(i=i)]) and torch.equal(down, source[DOWN.format(i=i)])
        gate, up, w2 = sglang_splits(gate_up, down)
        for e in range(4):
            fc1 = lm[f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight"]
            assert torch.equal(torch.cat([gate[e], up[e]]), fc1)
            assert torch.equal(w2[e], lm[f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight"])
    assert not any(".experts.0." in k for k in written)  # never per-expert and fused in one load (SGLang's flag)
    rope = json.loads(open(f"{path}/config.json").read())["text_config"]["rope_scaling"]  # SGLang's config class
    assert rope["mrope_interleaved"] is True and rope["mrope_section"] == [3, 3, 2]  # reads rope_scaling only


def test_a_fused_pair_of_neither_layout_is_one_error(tmp_path):
    from safetensors.torch import save_file

    from rlhf_mcore.models.hf_io import LazyStateDict

    save_file({"m.experts.gate_up_proj": torch.zeros(4, 64, 90), "m.experts.down_proj": torch.zeros(4, 48, 64)},
              str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError) as err:
        LazyStateDict([tmp_path / "bad.safetensors"])
    assert str(err.value) == ("m.experts.gate_up_proj: fused experts of shapes [4, 64, 90] (gate_up_proj) and "
                              "[4, 48, 64] (down_proj) are neither [E, H, 2I] + [E, I, H] (the Hub's) nor "
                              "[E, 2I, H] + [E, H, I] (transformers'). Use the model's own checkpoint.")
    save_file({"m.experts.gate_up_proj": torch.zeros(4, 64, 96)}, str(tmp_path / "alone.safetensors"))
    with pytest.raises(ValueError, match=r"^m.experts.gate_up_proj: fused experts without their "
                                         r"'m.experts.down_proj'"):
        LazyStateDict([tmp_path / "alone.safetensors"])


def test_a_view_reads_one_expert_and_membership_reads_nothing(dirs, monkeypatch):
    from rlhf_mcore.models.hf_io import LazyStateDict, weight_files

    sd = LazyStateDict(weight_files(dirs["hub"]), (("model.language_model.", "model."),))
    name = "model.layers.2.mlp.experts.3.up_proj.weight"
    assert name in sd and "model.layers.2.mlp.experts.gate_up_proj" not in sd  # listed per expert only
    assert sd.shape(name) == (48, 64) and sd.shape("model.layers.2.mlp.experts.3.down_proj.weight") == (64, 48)
    want = tiny_vl3_moe_model().model.language_model.layers[2].mlp.experts.gate_up_proj[3, 48:]
    assert torch.equal(sd[name], want) and torch.equal(sd.read_slice(name, 1, 8, 16), want[:, 8:16])
    monkeypatch.setattr(LazyStateDict, "__getitem__", lambda *a: pytest.fail("membership read a tensor"))
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in sd and "nothing" not in sd


def test_what_neither_half_supports_is_refused_one_line_each(dirs):
    from rlhf_mcore.models.families import qwen3_vl_moe

    flat = qwen3_vl_moe.SPEC.text_config(json.loads((dirs["hub"] / "config.json").read_text()))
    qwen3_vl_moe.check(flat, "config.json")  # the tiny model's own config passes
    bad = {**flat, "attention_bias": True, "mlp_only_layers": [1],
           "rope_parameters": {**flat["rope_parameters"], "mrope_section": [3, 3, 3]}}
    with pytest.raises(ValueError) as err:
        qwen3_vl_moe.check(bad, "config.json")
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and all(line.startswith("config.json: ") for line in lines)
    assert "mrope_section" in lines[0] and "'attention_bias'=true" in lines[1] and "mlp_only_layers=[1]" in lines[2]


def test_the_preset_at_tp2_is_refused_at_validation_and_ep2_pp2_pass():
    """tp > 1 would need sequence parallelism for the MoE layer, which no vision LM takes: one line naming tp and the
    layouts that work, before any process builds a model; EP2 and PP2 (DeepStack's 3 levels need all 3 LM layers on
    the first stage: refused at pp=2 as for Qwen3-VL) validate as expected."""
    from rlhf_mcore.config import load_config
    from rlhf_mcore.config.validate import validate
    from tests.support.paths import CONFIGS

    def errors(overrides, world):
        return validate(load_config(str(CONFIGS / "tiny_vlm3_moe_grpo.yaml"), overrides, check=False), world)

    tp2 = [e for e in errors(["parallel.tp=2"], 2) if e.startswith("parallel.tp: Qwen3-VL-MoE")]
    assert tp2 == ["parallel.tp: Qwen3-VL-MoE trains at tp=1 for now (got 2): megatron's MoE layer needs sequence "
                   "parallelism at tp > 1, which vision LMs do not take yet. Split the experts with parallel.ep and "
                   "the layers with parallel.pp."]
    assert errors(["parallel.ep=2"], 2) == [] and errors([], 1) == []
    assert any("DeepStack" in e for e in errors(["parallel.pp=2"], 2))


def test_sglangs_routing_record_reads_the_nested_moe_fields():
    """actor.router_replay=R3 through SGLang records [tokens, layers, top-k] per row: the shape comes from the LM's
    fields under text_config (read at the top level it raised KeyError before the first rollout)."""
    from rlhf_mcore.rollout.sglang_routing import SGLangRouting
    from tests.support.paths import ROOT

    hf = json.loads((ROOT / "data" / "tiny_vlm3_moe" / "config.json").read_text())
    routing = SGLangRouting.for_model(torch.nn.Module(), hf)  # no routers on this (empty) stage
    assert (routing.num_layers, routing.topk, routing.num_experts, routing.layers) == (3, 2, 4, [])
