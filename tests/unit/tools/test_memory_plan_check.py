"""tools/bench/memory_plan_check.py --repredict: a saved bench result (its config, config.json and measured peaks)
is planned again with the current code, and set against the same measurements."""
import json

from rlhf_mcore.config import ActorConfig, AlgorithmConfig, Config, DataConfig, ModelConfig, RolloutConfig
from rlhf_mcore.config.load import to_dict
from rlhf_mcore.plan.dynamic import layer_activation_bytes, logprob_backward_bytes
from rlhf_mcore.plan.params import WEIGHT_BYTES, Shape
from rlhf_mcore.plan.rollout import static_state_bytes
from rlhf_mcore.plan.static import Layout, roles_of, stage_bytes
from tools.bench.memory_plan_check import main

HF = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=1000, tie_word_embeddings=True,
          num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
GIB = 2**30


def test_repredict_plans_a_saved_result_against_its_measurements(tmp_path):
    cfg = Config(model=ModelConfig(dtype="bf16"), algorithm=AlgorithmConfig(adv_estimator="grpo"),
                 rollout=RolloutConfig(n=2, max_response_length=16),
                 actor=ActorConfig(ppo_mini_batch_size=4, micro_batch_size_per_gpu=4),
                 data=DataConfig(train_batch_size=4, max_prompt_length=8))
    result = {"label": "tiny", "plan_input": {"config": to_dict(cfg), "hf": HF,
                                              "phase_peaks_gib": {"gen": 0.5, "update_actor": 1.0, "reward": 0.1}}}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([result]))
    assert main(["--repredict", str(path), "--out", str(tmp_path / "table.json")]) == 0
    rows = {r["phase"]: r for r in json.loads((tmp_path / "table.json").read_text())}
    assert sorted(rows) == ["log_prob", "optimizer", "rollout", "update"]
    assert rows["log_prob"]["measured_gib"] is None and rows["update"]["measured_gib"] == 1.0

    # the update by hand: 8 rows x 24 tokens, one micro-batch of 4 rows (96 tokens), padded (SDPA's output copy)
    shape = Shape.of(HF)
    static = stage_bytes(shape, Layout(1, 1, 1, 1), 0, roles_of(cfg), "bf16", False)["actor"]
    cache = static_state_bytes(shape, 8, 24, 16, "bf16")  # kept by rollout.native.keep_graphs
    tokens = 4 * 24
    update = (sum(static.values()) + cache + 2 * tokens * layer_activation_bytes(shape, 1, "bf16", out_copy=True)
              + tokens * (2 * 64 * WEIGHT_BYTES["bf16"] + 4) + logprob_backward_bytes(shape, tokens, 1, "bf16"))
    assert rows["update"]["predicted_gib"] * GIB == update
    assert rows["update"]["ratio"] == update / GIB
    assert rows["rollout"]["ratio"] == rows["rollout"]["predicted_gib"] / 0.5


def test_sglangs_rollout_is_measured_by_the_devices_memory_in_use(tmp_path):
    """rollout.engine=sglang: the plan's rollout holds the engine's fraction of the device, and it is set against
    the device memory in use during the generation (the scheduler process's pool), never this process's
    allocator peak; a result without that figure has no measured rollout."""
    cfg = Config(model=ModelConfig(dtype="bf16"), rollout=RolloutConfig(engine="sglang", n=2, max_response_length=16),
                 actor=ActorConfig(ppo_mini_batch_size=4, micro_batch_size_per_gpu=4),
                 data=DataConfig(train_batch_size=4, max_prompt_length=8))
    saved = {"config": to_dict(cfg), "hf": HF, "phase_peaks_gib": {"gen": 0.5, "update_actor": 1.0},
             "gpu_memory_gib": 100.0}
    results = [{"label": "with", "plan_input": {**saved, "device_used_gib": {"gen": 60.0}}},
               {"label": "without", "plan_input": saved}]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(results))
    assert main(["--repredict", str(path), "--out", str(tmp_path / "table.json")]) == 0
    rows = {(r["variant"], r["phase"]): r for r in json.loads((tmp_path / "table.json").read_text())}
    rollout = rows["with", "rollout"]
    assert rollout["terms_gib"]["sglang"] == 0.5 * 100.0 and rollout["measured_gib"] == 60.0
    assert rollout["ratio"] == rollout["predicted_gib"] / 60.0
    assert rows["without", "rollout"]["measured_gib"] is None and rows["without", "update"]["measured_gib"] == 1.0
