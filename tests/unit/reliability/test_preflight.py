"""Bad data, paths and reward files are found before any model is built: one line per problem."""
import time

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.preflight import preflight_errors
from tests.support.paths import CONFIGS
from tests.support.reliability import ROOT, tiny_cfg, vowel_row, write_rows

REWARD = f"{ROOT / 'data/tiny/reward.py'}:vowel_fraction"


def errors_for(tmp_path, rows=None, *overrides):
    extra = [f"data.train_files={write_rows(tmp_path / 'train.parquet', rows)}"] if rows is not None else []
    return preflight_errors(tiny_cfg(tmp_path, *extra, "data.val_files=", *overrides))


def test_the_shipped_tiny_config_passes(tmp_path):
    assert preflight_errors(tiny_cfg(tmp_path)) == []


def test_data_source_without_a_reward_names_the_row(tmp_path):
    rows = [vowel_row(data_source="gsm8k", ground_truth="3")] * 3 + [vowel_row(data_source="gsm8kk")] * 2
    errs = errors_for(tmp_path, rows, "reward.custom_fn=")
    assert len(errs) == 1, errs
    assert errs[0].startswith(f"data.train_files: {tmp_path / 'train.parquet'}: row 3 and 1 more rows: data_source "
                              "'gsm8kk' has no reward function (registered: "), errs


def test_ground_truth_of_the_wrong_type_is_caught_by_a_probe_call(tmp_path):
    rows = [vowel_row(ground_truth=72)] * 4  # vowel_fraction needs a string: `c in 72` raises
    errs = errors_for(tmp_path, rows)
    assert len(errs) == 1 and errs[0].startswith(f"data.train_files: {tmp_path / 'train.parquet'}: row 0: "
                                                 f"reward.custom_fn: {REWARD} fails on this row (ground_truth int 72)")
    assert "TypeError" in errs[0]


def test_malformed_rows_one_line_each(tmp_path):
    good = vowel_row()
    bad = [{**good, "prompt": []}, {**good, "data_source": ""}, {**good, "reward_model": {"style": "rule"}}]
    path = tmp_path / "train.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([good, *bad]), path)  # written around the validating writer
    errs = preflight_errors(tiny_cfg(tmp_path, f"data.train_files={path}", "data.val_files="))
    assert [e.split(": ")[2] for e in errs] == ["row 1", "row 2", "row 3"], errs
    assert "prompt: must be a non-empty list" in errs[0] and "data_source: must be a non-empty" in errs[1]
    assert "reward_model: must be a dict with a ground_truth" in errs[2]


def test_a_jsonl_file_is_not_parquet(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"data_source": "gsm8k"}\n')
    errs = preflight_errors(tiny_cfg(tmp_path, f"data.train_files={path}", "data.val_files="))
    assert len(errs) == 1 and errs[0].startswith(f"data.train_files: {path}: not a parquet file (it starts with"), errs


def test_missing_paths_each_named(tmp_path):
    missing = tmp_path / "nope"
    errs = preflight_errors(tiny_cfg(tmp_path, f"model.load={missing}", f"reward.model_path={missing}",
                                     f"ref.load={missing}", f"trainer.resume={missing}"))
    assert [e.split(":")[0] for e in errs] == ["model.load", "ref.load", "reward.model_path", "trainer.resume"], errs
    errs = preflight_errors(tiny_cfg(tmp_path, f"model.tokenizer={missing}"))
    assert len(errs) == 1 and errs[0].startswith("model.tokenizer: not found"), errs


def test_vocab_smaller_than_the_tokenizer(tmp_path):
    errs = preflight_errors(tiny_cfg(tmp_path, "model.vocab_size=200"))
    assert errs == ["model.vocab_size: below the tokenizer's 258 ids (got 200). Set it to at least 258."]


def write_reward(tmp_path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body + "\ndef score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    return str(path)


def test_custom_reward_file_problems_one_line_each(tmp_path):
    good = write_reward(tmp_path, "")
    errs = preflight_errors(tiny_cfg(tmp_path, f"reward.custom_fn={good}:scor"))
    assert len(errs) == 1 and errs[0].startswith(f"reward.custom_fn: '{good}' has no function 'scor'"), errs
    broken = write_reward(tmp_path, "import not_a_module_anywhere")
    errs = preflight_errors(tiny_cfg(tmp_path, f"reward.custom_fn={broken}:score"))
    assert len(errs) == 1 and "importing" in errs[0] and "ModuleNotFoundError" in errs[0], errs


def test_custom_reward_that_hangs_or_exits_at_import_is_stopped_in_its_worker(tmp_path):
    hangs = write_reward(tmp_path, "import time\ntime.sleep(600)")
    start = time.monotonic()
    errs = preflight_errors(tiny_cfg(tmp_path, f"reward.custom_fn={hangs}:score", "reward.timeout_s=1"))
    assert time.monotonic() - start < 30
    assert len(errs) == 1 and errs[0].startswith(f"reward.custom_fn: {hangs}:score: importing or calling it timed "
                                                 "out after reward.timeout_s=1 s"), errs
    exits = write_reward(tmp_path, "import os\nos._exit(3)")
    errs = preflight_errors(tiny_cfg(tmp_path, f"reward.custom_fn={exits}:score"))
    assert len(errs) == 1 and "reward worker died (exit code 3)" in errs[0], errs


def test_an_engine_that_needs_cuda_stops_before_the_model_on_a_machine_without(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr("rlhf_mcore.config.environment.importable", lambda module: True)  # as if sglang were there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert preflight_errors(tiny_cfg(tmp_path, "rollout.engine=sglang")) == [
        "rollout.engine: sglang needs a CUDA GPU (got sglang on a machine without CUDA). Use rollout.engine=native."]
    assert preflight_errors(tiny_cfg(tmp_path)) == []  # native decodes on CPU


def test_a_plan_over_the_device_stops_naming_the_phase_the_term_and_the_fix(tmp_path):
    """The memory plan at start-up (here a given device size: CPU runs skip it): SmolLM2's GRPO preset at a
    65536-token budget plans 43.5 GiB in its update (one 65,536-token bin of 128 rows, the decoder's KV cache),
    37.9 GiB without the cache, which the engine frees on a device that small (so the check plans that); a
    16 GiB device stops it with the activations' fix, a smaller budget fits, and
    trainer.check_memory_plan=false starts anyway."""
    import json

    from rlhf_mcore.trainer.preflight import memory_plan_errors
    from tests.support.shapes import HF_SHAPES

    (tmp_path / "config.json").write_text(json.dumps({**HF_SHAPES["smollm2"], "architectures": ["LlamaForCausalLM"],
                                                      "tie_word_embeddings": True}))
    preset = str(CONFIGS / "gsm8k_grpo_smollm2.yaml")
    cfg = load_config(preset, [f"model.hf_path={tmp_path}"], check=False)
    from rlhf_mcore.plan.phases import cache_release_reason

    assert "update phase needs 43.53 GiB" in cache_release_reason(cfg, 16 * 2**30, 1)
    (line,) = memory_plan_errors(cfg, device_bytes=16 * 2**30)
    assert line.startswith("memory plan: the update phase needs 37.9 GiB per rank on a 16.0 GiB device "
                           "(activations 33.8 GiB;") and "Cheapest fix: lower actor.max_tokens_per_gpu" in line
    assert line.endswith("or set trainer.check_memory_plan=false to start anyway.")
    small = load_config(preset, [f"model.hf_path={tmp_path}", "actor.max_tokens_per_gpu=8192"], check=False)
    assert memory_plan_errors(small, device_bytes=16 * 2**30) == []
    off = load_config(preset, [f"model.hf_path={tmp_path}", "trainer.check_memory_plan=false"], check=False)
    assert memory_plan_errors(off, device_bytes=16 * 2**30) == []


def test_engine_model_size_of_a_vision_lm_counts_its_tower_as_transformers_does():
    """A vision LM's config.json nests the LM under text_config (the GPU preset once failed on it): the engine's
    copy is the whole model, as transformers builds it, and its KV cache is the LM's."""
    import json

    from rlhf_mcore.trainer.preflight import engine_model_size
    from tests.support.tiny_vl import hf_param_count

    hf = json.loads((ROOT / "data/tiny_vlm/config.json").read_text())
    text = hf["text_config"]
    kv = 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * (
        text["hidden_size"] // text["num_attention_heads"]) * 2
    assert engine_model_size(hf, 2) == (hf_param_count(hf), kv)
    from tests.support.shapes import HF_SHAPES

    moe = HF_SHAPES["qwen3-vl-30b-a3b"]  # every expert, the tower with its DeepStack mergers: 31.07 B
    assert engine_model_size(moe, 2)[0] == hf_param_count(moe) == 31_070_754_032
