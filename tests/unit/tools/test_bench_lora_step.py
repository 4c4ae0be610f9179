"""tools/bench/bench_lora_step.py --tiny on CPU (the GPU command's code path at test size): every row, the
trainable counts by hand, the layer cut, and the FLOPs model (the frozen base has no weight gradient)."""
import doctest
import json
import math

import tools.bench.bench_lora_step as bench
from rlhf_mcore.models.lora import expand_targets
from rlhf_mcore.models.lora_budget import lora_param_count


def test_flops_model_examples_and_the_7b_shape():
    assert doctest.testmod(bench).failed == 0
    hf = bench.QWEN7B
    adapters = lora_param_count({"layers": 28, "h": 3584, "q": 3584, "kv": 512, "ffn": 18944}, 32,
                                expand_targets("all-linear"))
    assert adapters == 80_740_352  # 28 x 32 x (2 x 7168 + 2 x 4096 + 3 x 22528)
    full = bench.phase_flops_per_token(hf, 1024, "update", 0)
    lora = bench.phase_flops_per_token(hf, 1024, "update", adapters)
    assert 0.66 < lora / full < 0.69  # 2/3 of the weight FLOPs, attention's backward kept, + the adapters
    # the GPU command's layer count for full fine-tuning (no GPU here: an H200's 139 GiB)
    args = bench.parse_args([])
    assert bench.full_layer_count(hf, args) == 20 and bench.full_layer_count(hf, bench.parse_args(["--tiny"])) == 2
    assert bench.full_layer_count(hf, bench.parse_args(["--capacity-gib", "1000"])) == 28


def test_tiny_run_writes_every_row(tmp_path, mcore_ctx):
    rows = bench.main(["--tiny", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "lora_step_tiny.json").read_text())["rows"] == json.loads(json.dumps(rows))
    assert not [r for r in rows if "error" in r or "skipped" in r]
    got = {(r["model"], r["layers"], r["phase"]): r for r in rows}
    assert set(got) == {(m, n, p) for m, n in (("lora", 4), ("lora", 2), ("full", 2))
                        for p in ("log_prob", "update", "grpo step")}
    dims = {"h": 64, "q": 64, "kv": 32, "ffn": 128}
    for n in (4, 2):
        want = lora_param_count({**dims, "layers": n}, 32, expand_targets("all-linear"))
        assert round(got[("lora", n, "update")]["trainable_m"] * 1e6) == want
    # the cut LoRA model is the full 2-layer model plus its adapters
    assert round(got[("lora", 2, "update")]["params_b"] * 1e9) == \
        round(got[("full", 2, "update")]["params_b"] * 1e9) + round(got[("lora", 2, "update")]["trainable_m"] * 1e6)
    assert round(got[("full", 2, "update")]["trainable_m"] * 1e6) == round(got[("full", 2, "update")]["params_b"] * 1e9)
    for r in rows:
        assert r["step_s"] > 0 and r["tflops"] > 0
        if r["phase"] == "update":
            assert math.isfinite(r["loss"])
    for model, layers, _ in got:
        phase = {p: got[(model, layers, p)]["step_s"] for p in ("log_prob", "update", "grpo step")}
        assert abs(phase["grpo step"] - phase["log_prob"] - phase["update"]) < 1e-9


def test_the_gpu_command_path_at_a_small_shape(tmp_path, mcore_ctx, monkeypatch):
    """The non-tiny path (bf16, the layer count from the estimate, the budget check) on a small shape."""
    monkeypatch.setattr(bench, "QWEN7B", {**bench.QWEN7B, **bench.TINY, "num_hidden_layers": 3})
    rows = bench.main(["--sequences", "2", "--seq-len", "16", "--micro-batch", "1", "--steps", "1", "--warmup", "0",
                       "--capacity-gib", "0.0133", "--out", str(tmp_path)])
    layers = {(r["model"], r["layers"]) for r in rows}
    assert layers == {("lora", 3), ("lora", 2), ("full", 2)}, rows  # 0.0133 GiB: 2 layers fit by estimate
    assert all(r["step_s"] > 0 for r in rows) and json.loads((tmp_path / "lora_step.json").read_text())["notes"]


def test_gpu_initialization_only_changes_where_weights_are_drawn():
    import rlhf_mcore.models.build as build_module
    from rlhf_mcore.config import ModelConfig, ParallelConfig

    hf = {**bench.QWEN7B, **bench.TINY}
    original = build_module.to_transformer_config
    with bench.gpu_initialization():
        tc = build_module.to_transformer_config(hf, ModelConfig(), ParallelConfig())
    assert build_module.to_transformer_config is original and tc.use_cpu_initialization is False
    assert original(hf, ModelConfig(), ParallelConfig()).use_cpu_initialization is True
