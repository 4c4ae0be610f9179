"""The memory plan's static terms (rlhf_mcore/plan/static.py) and its command, against a hand count at
Qwen3-30B-A3B's real shape (configs/qwen3-30b-a3b_gsm8k_grpo.yaml) on 8 GPUs of 141 GiB."""
import json
import re

from rlhf_mcore.plan.__main__ import main
from rlhf_mcore.plan.params import Shape, rank_expert_params, rank_params
from rlhf_mcore.plan.static import Layout, Role, layouts, peak_bytes
from tests.support.paths import CONFIGS
from tests.support.shapes import HF_SHAPES

QWEN3_30B = Shape.of(HF_SHAPES["qwen3-30b-a3b"])


def test_params_per_rank_of_the_30b_moe_at_ep8_by_hand():
    layer = (2 * 2048  # input and pre-MLP norms
             + (32 + 2 * 4) * 128 * 2048 + 2048 * 32 * 128 + 2 * 128  # q/k/v, output, q/k norms
             + 128 * 2048 + (128 // 8) * 3 * 768 * 2048)  # router, 16 whole experts of 128
    total = 48 * layer + 2 * 151936 * 2048 + 2048  # embedding, untied head, final norm
    assert rank_params(QWEN3_30B, tp=1, pp=1, ep=8, pp_rank=0) == total == 5_164_972_032
    # bf16 weights 2 B, fp32 grads 4 B, Adam + main weights 12 B: the dense part's sharded over DP8, the 16 local
    # experts' over their expert-data-parallel group, 1 x 8 / 8 = 1 rank (megatron's expert buffers): not sharded
    experts = 48 * 16 * 3 * 768 * 2048
    assert rank_expert_params(QWEN3_30B, pp=1, ep=8) == experts
    want = total * 2 + total * 4 + (total - experts) * 12 // 8 + experts * 12
    assert peak_bytes(QWEN3_30B, Layout(1, 1, 8, 8), [Role("actor", True)], "bf16", True) == want
    # TP4 x EP8 on 8 GPUs (slime's layout; dp 2): the expert group spans TP, and the experts' Adam is again unsharded
    assert Layout(4, 1, 8, 2).expert_dp == 1 and Layout(2, 1, 4, 4).expert_dp == 2


def test_layouts_respect_heads_layers_and_experts():
    found = {str(x) for x in layouts(QWEN3_30B, 8)}
    assert "TP1 PP1 EP8 DP8" in found and "TP8 PP1 EP1 DP1" not in found  # 4 KV groups: TP <= 4
    assert "TP4 PP1 EP8 DP2" in found and "TP1 PP2 EP8 DP4" not in found  # EP spans TP x DP, not PP
    assert all(x.tp * x.dp % x.ep == 0 and x.tp * x.pp * x.dp == 8 for x in layouts(QWEN3_30B, 8))


def test_the_command_lists_what_fits_best_first(tmp_path, capsys, monkeypatch):
    """Run from an empty directory: a plan needs the model's config.json, not the preset's data files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    assert main(["--config", str(CONFIGS / "qwen3-30b-a3b_gsm8k_grpo.yaml"), f"model.hf_path={tmp_path}",
                 "--gpus", "8", "--gpu-memory", "141"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("memory plan: 8 GPU(s) of 141 GiB, bf16, roles actor, rollout native, distributed optimizer on, "
                      "recompute full")
    assert out[2] == "  TP1 PP1 EP8 DP8              98.66 GiB  rollout   fits"
    # MoE decodes eagerly (Qwen3-MoE's decode_paths): kv_cache 2 x 48 layers x 128 rows x 4 groups x 1536 x 128 x 2 B
    # = 18 GiB, dropped after the rollout; prefill: 65,536 prompt tokens x (3 x 2048 + 8 x (3 x 2048 + 3 x 768)) x 2 B
    # (9 GiB) + 16 local experts' stacked weights 16 x 3 x 768 x 2048 x 2 B (0.14 GiB); grads+optimizer: 4 B of
    # gradient per parameter (19.24 GiB), Adam's 12 B over DP8 for the dense 1.54 B parameters (2.15 GiB) and
    # unsharded for the 3.62 B expert parameters (40.50 GiB; their expert-data-parallel group is 1 rank)
    rollout = next(line for line in out if line.startswith("  rollout "))
    assert rollout == "  rollout      98.66 GiB = weights 9.62 + grads+optimizer 61.89 + kv_cache 18.00 + prefill 9.14"
    table = [line for line in out if "GiB  " in line and line.startswith("  TP")]
    fits = [line.endswith(" fits") for line in table]
    assert fits == sorted(fits, reverse=True) and not fits[-1]  # fitting layouts first; some do not fit


def test_without_the_gpu_size_no_layout_is_said_to_fit(tmp_path, capsys, monkeypatch):
    """--gpu-memory unknown: the peaks without a verdict (170 GiB was once printed as "fits")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    assert main(["--config", str(CONFIGS / "qwen3-30b-a3b_gsm8k_grpo.yaml"), f"model.hf_path={tmp_path}",
                 "--gpus", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "peak per rank (its phase); pass --gpu-memory GiB to see which layouts fit"
    table = [line for line in out if line.startswith("  TP")]
    assert table and all(line.endswith("rollout") or line.split()[-1] in ("log_prob", "update", "optimizer")
                         for line in table), table


def test_a_missing_model_is_one_line(tmp_path, capsys):
    assert main(["--config", str(CONFIGS / "qwen3-30b-a3b_gsm8k_grpo.yaml"), f"model.hf_path={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == (f"model.hf_path: no config.json in {str(tmp_path)!r}. Point it at an "
                                                "HF model directory.")


def test_the_command_lists_only_the_layouts_the_family_runs(tmp_path, capsys, monkeypatch):
    """configs/qwen3-vl-30b-a3b_geo3k_grpo.yaml at Qwen3-VL-30B-A3B's shape: the shape alone allows TP2/TP4 and PP
    2-8, but an MoE vision LM trains at tp 1 and, with full recompute, DeepStack at pp 1 (`run_errors`): only
    TP1 PP1 layouts are listed; with selective recompute the pipeline splits come back (DeepStack's 3 levels fit
    every stage of 6 or more layers), still at TP1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-vl-30b-a3b"]))
    listed = {}
    for recompute in ("full", "selective"):
        assert main(["--config", str(CONFIGS / "qwen3-vl-30b-a3b_geo3k_grpo.yaml"), f"model.hf_path={tmp_path}",
                     f"model.recompute={recompute}", "--gpus", "8", "--gpu-memory", "141"]) == 0
        listed[recompute] = [" ".join(line.split()[:4]) for line in capsys.readouterr().out.splitlines()
                             if line.startswith("  TP")]
    assert listed["full"] == ["TP1 PP1 EP8 DP8", "TP1 PP1 EP4 DP8", "TP1 PP1 EP2 DP8", "TP1 PP1 EP1 DP8"]
    assert {x.split()[1] for x in listed["selective"]} == {"PP1", "PP2", "PP4", "PP8"}
    assert all(x.startswith("TP1 ") for x in listed["selective"]) and len(layouts(Shape.of(
        HF_SHAPES["qwen3-vl-30b-a3b"]), 8)) > len(listed["selective"])


def test_a_vision_moes_plan_routes_each_token_to_its_top_k_experts(tmp_path, capsys, monkeypatch):
    """Qwen3-VL-MoE nests `num_experts_per_tok` under text_config: the plan reads it there (top-8), so its MoE prefill
    term is the text Qwen3-30B-A3B's under the same run settings (the same LM shape); read at the top level it was
    top-1, and the rollout's peak 7.6 GiB short (then 66.5 instead of 74.1 GiB at EP8)."""
    monkeypatch.chdir(tmp_path)
    terms = {}
    for name in ("qwen3-vl-30b-a3b", "qwen3-30b-a3b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(HF_SHAPES[name]))
        assert main(["--config", str(CONFIGS / "qwen3-vl-30b-a3b_geo3k_grpo.yaml"), f"model.hf_path={tmp_path / name}",
                     "--gpus", "8", "--gpu-memory", "141"]) == 0
        rollout = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("rollout"))
        terms[name] = dict(re.findall(r"([a-z_+]+) (\d+\.\d+)", rollout.split("=", 1)[1]))
    assert terms["qwen3-vl-30b-a3b"]["prefill"] == terms["qwen3-30b-a3b"]["prefill"] == "11.39"
    assert "tower" in terms["qwen3-vl-30b-a3b"] and "tower" not in terms["qwen3-30b-a3b"]


def test_an_moe_at_tp_above_1_is_listed_only_for_the_engine_that_decodes_with_sequence_parallelism(
        tmp_path, capsys, monkeypatch):
    """Qwen3-30B-A3B trains at tp > 1 only with sequence parallelism, which the native engine cannot decode with: with
    the preset's native rollout every listed layout is TP1; with SGLang the TP2/TP4 layouts (EP spanning TP x DP,
    e.g. TP4 x EP8 x DP2) are listed too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    listed = {}
    for engine in ("native", "sglang"):
        assert main(["--config", str(CONFIGS / "qwen3-30b-a3b_gsm8k_grpo.yaml"), f"model.hf_path={tmp_path}",
                     f"rollout.engine={engine}", "--gpus", "8"]) == 0
        listed[engine] = [line.split()[:4] for line in capsys.readouterr().out.splitlines() if line.startswith("  TP")]
    assert listed["native"] and all(row[0] == "TP1" for row in listed["native"])
    assert ["TP4", "PP1", "EP8", "DP2"] in listed["sglang"] and len(listed["sglang"]) > len(listed["native"])


def test_when_nothing_fits_the_plan_says_what_would(tmp_path, capsys, monkeypatch):
    """The 30B preset with SGLang (a whole copy of the model on every GPU beside the resident Adam state) fits no
    layout of 8 x 141 GiB; the plan names the offload that makes EP8 fit. On 2 GPUs (fewer than the preset's ep=8:
    its own layout there has no expert-data-parallel rank, which once divided by zero) nothing fits either way."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    preset = ["--config", str(CONFIGS / "qwen3-30b-a3b_gsm8k_grpo.yaml"), f"model.hf_path={tmp_path}"]
    assert main([*preset, "rollout.engine=sglang", "--gpus", "8", "--gpu-memory", "141"]) == 0
    out = capsys.readouterr().out
    assert "  no layout fits; with trainer.offload_during_rollout=true (Adam's state on the host while the rollout " \
           "runs) TP1 PP1 EP8 DP8 peaks at 94.34 GiB (rollout) and fits" in out
    assert main([*preset, "rollout.engine=sglang", "trainer.offload_during_rollout=true", "--gpus", "8",
                 "--gpu-memory", "141"]) == 0
    assert "no layout fits" not in capsys.readouterr().out
    assert main([*preset, "--gpus", "2", "--gpu-memory", "80"]) == 0
    assert "  no layout fits 2 GPU(s) of 80 GiB: plan more GPUs (--gpus) or a smaller batch" in capsys.readouterr().out
