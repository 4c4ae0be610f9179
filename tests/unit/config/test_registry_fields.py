"""One loop checks every config field that names a registry entry: a bad value gets exactly one error."""
import pytest

from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.config.validate import registry_fields
from tests.support.paths import ROOT_STR as ROOT

TINY = f"{ROOT}/configs/tiny_grpo.yaml"


def test_every_registry_field_is_checked_once():
    cfg = load_config(TINY)
    keys = [key for key, *_ in registry_fields(cfg)]
    assert len(keys) == len(set(keys)) == 14
    for key, registry, extras, _ in registry_fields(cfg):
        with pytest.raises(ConfigError) as e:
            load_config(TINY, [f"{key}=bogus_value"])
        assert [err for err in e.value.errors if err.startswith(f"{key}:")] == e.value.errors, e.value.errors
        assert len(e.value.errors) == 1 and "'bogus_value'" in e.value.errors[0]
        for name in [*extras, *registry.choices()][:1]:
            assert name in e.value.errors[0]


def test_values_from_the_registry_pass():
    cfg = load_config(TINY, ["actor.rollout_correction=sequence", "actor.loss_agg_mode=seq-mean-token-sum-norm",
                             "algorithm.kl_ctrl_type=adaptive", "reward.answer_format=boxed",
                             "model.attention_backend=sdpa"])
    assert cfg.actor.rollout_correction == "sequence"


def test_internal_entries_are_not_a_choice():
    with pytest.raises(ConfigError, match="actor.loss_agg_mode: must be one of token-mean"):
        load_config(TINY, ["actor.loss_agg_mode=seq-mean-all-rows"])
