"""The MoE layout rules, checked before any model is built: expert TP is refused, SP is needed at tp > 1, and
verl's expert_model_parallel_size lands on parallel.ep."""
import os

import pytest

from tests.support.paths import ROOT_STR as ROOT
from tests.support.tiny_moe import tiny_moe


def test_expert_tp_and_sequence_parallel_rules_before_build(tmp_path):
    from rlhf_mcore.config.load import ConfigError, load_config

    tiny = os.path.join(ROOT, "configs", "tiny_grpo.yaml")
    tiny_moe(True).config.to_json_file(str(tmp_path / "config.json"))
    moe = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                       "num_query_groups", "vocab_size")] + [f"model.hf_path={tmp_path}"]
    with pytest.raises(ConfigError) as info:
        load_config(tiny, moe + ["parallel.etp=2", "parallel.tp=2"], world_size=2)
    assert "parallel.etp: expert tensor parallelism is not supported (got 2); experts are never split over TP. " \
           "Set parallel.etp=1 and split the experts with parallel.ep." in info.value.errors
    with pytest.raises(ConfigError) as info:
        load_config(tiny, moe + ["parallel.tp=2", "rollout.engine=sglang"], world_size=2)
    assert [e for e in info.value.errors if e.startswith("parallel.sequence_parallel")] == [
        "parallel.sequence_parallel: an MoE model at tp > 1 needs sequence parallelism (got false with tp=2; verl's "
        "megatron engine turns it on at tp > 1). Set parallel.sequence_parallel=true, or split the experts with "
        "parallel.ep at tp=1."]
    with pytest.raises(ConfigError) as info:  # the native engine: the line names the engine that decodes with it
        load_config(tiny, moe + ["parallel.tp=2"], world_size=2)
    assert any("Set parallel.sequence_parallel=true with rollout.engine=sglang (the native engine decodes without "
               "it), or split" in e for e in info.value.errors), info.value.errors
    cfg = load_config(tiny, moe + ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"], world_size=2)
    assert cfg.parallel.ep == 2 and cfg.parallel.etp == 1
