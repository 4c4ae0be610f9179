"""tools/bench/bench_moe_step.py --tiny on CPU (the GPU command's code path at test size) and its memory model
(tools/bench/moe_memory.py) against hand counts and the parameters megatron really builds."""
import json
import math

from tools.bench import moe_memory
from tools.bench.bench_moe_step import MOE, TINY, main


def test_layer_params_of_the_moe_shape_by_hand():
    attention = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128  # q/o, k/v, q/k norms
    experts = 128 * 3 * 2048 * 768 + 2048 * 128  # gate/up/down of every expert, router
    assert moe_memory.layer_params(MOE) == attention + experts + 2 * 2048 == 623_120_640
    assert moe_memory.outside_params(MOE) == 2 * 151936 * 2048 + 2048  # untied embedding and head


def test_tiny_run_writes_every_row_and_the_kernels_agree(tmp_path, mcore_ctx):
    result = main(["--tiny", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "moe_step_tiny.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    rows = {(r["model"], r["layers"], r.get("impl"), r.get("phase")): r for r in result["rows"]}
    assert not [r for r in result["rows"] if "error" in r]
    for layers in (2, 1):  # the MoE and the 2-layer (here 1-layer) model of --find-largest
        for impl in ("sequential", "grouped"):
            for phase in ("log_prob", "update"):
                r = rows[("moe", layers, impl, phase)]
                assert r["tokens_per_s"] > 0 and r["mfu"] > 0
        # same weights, fp32: the reference loop and SequentialMLP give the same log-probs
        assert rows[("moe", layers, "grouped", "log_prob")]["logp_max_diff_vs_sequential"] <= 1e-5
        assert math.isfinite(rows[("moe", layers, "grouped", "update")]["loss"])
    for name in ("qwen3-0.6b", "qwen2.5-0.5b"):
        assert rows[(name, 2, "dense", "update")]["step_s"] > 0
    # the memory model counts what megatron builds (the vocab padded to a multiple of 128)
    tiny = {**MOE, **TINY, "vocab_size": 384}
    want = moe_memory.outside_params(tiny) + 2 * moe_memory.layer_params(tiny)
    assert round(rows[("moe", 2, "grouped", "update")]["params_b"] * 1e9) == want
    largest = result["largest_moe"]  # the real shape's statement, from the estimate on CPU
    capacity = 139 * moe_memory.GIB - 3 * moe_memory.GIB
    n = largest["estimate_layers"]
    assert moe_memory.training_bytes(MOE, n, 64) <= capacity < moe_memory.training_bytes(MOE, n + 1, 64)
