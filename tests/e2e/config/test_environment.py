"""Checked with the config, before a process group or model exists: the packages the config names (logger sinks,
the rollout engine), the architecture of model.hf_path, and the MLP's split over TP. One line each, exit 2."""
import json
import os
import sys

import pytest

from rlhf_mcore.config.load import ConfigError, load_config
from tests.launch import cli
from tests.support.paths import ROOT_STR as ROOT

TINY = os.path.join(ROOT, "configs", "tiny_grpo.yaml")
BLANK = ["model.num_layers=null", "model.hidden_size=null", "model.ffn_hidden_size=null",
         "model.num_attention_heads=null", "model.num_query_groups=null", "model.vocab_size=null"]


def errors_of(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, overrides)
    return info.value.errors


def without(*modules):
    """Python source that makes `modules` unimportable (as if not installed), then runs the trainer's CLI."""
    return f"import sys; sys.modules.update(dict.fromkeys({modules!r})); " \
           "from rlhf_mcore.train import main; sys.exit(main())"


def run_cli(args, missing=()):
    return cli("-c", without(*missing), *args, check=False, timeout=120)


@pytest.mark.parametrize("sink", ["wandb", "tensorboard"])
def test_a_logger_without_its_package_is_one_line(monkeypatch, sink):
    monkeypatch.setitem(sys.modules, sink, None)  # find_spec answers None: not installed
    assert errors_of([f"trainer.logger=[console,{sink}]"]) == [
        f"trainer.logger: {sink} needs the {sink} package, which is not installed (got ['console', '{sink}']). "
        f"Run `pip install {sink}`, or drop {sink} from trainer.logger."]
    load_config(TINY, ["trainer.logger=[console,jsonl]"])  # a sink that needs nothing


def test_training_stops_at_a_missing_logger_before_anything_is_built():
    """Not --validate-only: the run stops with exit 2 and one line, no traceback, no process group."""
    proc = run_cli(["--config", TINY, "trainer.logger=[console,wandb]", "trainer.output_dir=runs/never"],
                   missing=("wandb",))
    assert proc.returncode == 2, proc.stderr
    assert "trainer.logger: wandb needs the wandb package" in proc.stderr and "Traceback" not in proc.stderr
    assert "torch.distributed" not in proc.stderr and not os.path.exists(os.path.join(ROOT, "runs", "never"))


def test_an_engine_without_its_package_is_one_line(monkeypatch):
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    assert ROLLOUT_ENGINES.traits("sglang").requires == ("sglang",)
    monkeypatch.setitem(sys.modules, "sglang", None)
    assert errors_of(["rollout.engine=sglang"]) == [
        "rollout.engine: sglang needs the sglang package, which is not importable (got sglang). Install the gpu "
        "extra (pip install 'rlhf-mcore[gpu]'), or use rollout.engine=native."]
    monkeypatch.setattr("rlhf_mcore.config.environment.importable", lambda module: True)
    load_config(TINY, ["rollout.engine=sglang"])


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                                                      "num_hidden_layers": 2, "num_attention_heads": 4}))
    proc = run_cli(["--config", TINY, "--validate-only", *BLANK, f"model.hf_path={tmp_path}"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "Gemma2" in x]
    assert line == (f"  - model.hf_path: {tmp_path}/config.json: unsupported architecture (architectures="
                    "['Gemma2ForCausalLM'], model_type='gemma2'). Supported: LlamaForCausalLM, "
                    "LlamaForSequenceClassification, MistralForCausalLM, MistralForSequenceClassification, "
                    "MixtralForCausalLM, MixtralForSequenceClassification, "
                    "Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2_5_VLForConditionalGeneration, "
                    "Qwen3ForCausalLM, "
                    "Qwen3ForSequenceClassification, Qwen3MoeForCausalLM, Qwen3MoeForSequenceClassification, "
                    "Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration.")


def test_tp_must_divide_the_mlp_size(tmp_path):
    assert errors_of(["model.ffn_hidden_size=130", "model.num_query_groups=4", "parallel.tp=4"]) == [
        "parallel.tp: must divide model.ffn_hidden_size=130 (got 4). Pick a divisor of the MLP size."]
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "intermediate_size": 130,
                                                      "hidden_size": 32, "vocab_size": 256}))
    assert errors_of([*BLANK, f"model.hf_path={tmp_path}", "parallel.tp=4"]) == [
        f"parallel.tp: must divide {tmp_path}/config.json: intermediate_size=130 (got 4). Pick a divisor of the "
        "MLP size."]
