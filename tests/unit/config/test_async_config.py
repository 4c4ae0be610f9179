"""async_training config: verl's keys switch partial rollouts on, each impossible combination is one line naming
the dotted key (exit 2 at --validate-only, no traceback), and verl's other fully-async keys are translated or
explained."""
import pytest

from rlhf_mcore.config.load import load_config
from tests.support.paths import ROOT
from tests.support.validate_only import validate_only_errors

TINY = str(ROOT / "configs" / "tiny_grpo.yaml")
ON = ("async_training.partial_rollout=true", "async_training.staleness_threshold=1")


def errors(capsys, *overrides: str, config: str = TINY) -> list[str]:
    return validate_only_errors(capsys, config, *overrides)


def test_verl_keys_turn_it_on(capsys):
    assert errors(capsys, *ON) == []
    cfg = load_config(TINY, list(ON) + ["async_training.use_rollout_log_probs=true",
                                        "async_training.require_batches=2"])
    assert cfg.async_training.partial_rollout and cfg.async_training.staleness_threshold == 1
    assert cfg.actor.old_log_prob == "rollout"


@pytest.mark.parametrize("overrides,phrase", [
    (("async_training.partial_rollout=true",), "async_training.partial_rollout: needs async_training.staleness_"
                                               "threshold >= 1 (got 0.0)"),
    (("async_training.staleness_threshold=1",), "async_training.staleness_threshold: bounds the lag of carried "
                                                "samples, but async_training.partial_rollout is off"),
    (ON + ("async_training.round_tokens=5",), "async_training.round_tokens: must divide "
                                              "rollout.max_response_length=16 (got 5)"),
    (ON + ("async_training.staleness_threshold=-1",), "async_training.staleness_threshold: must be >= 0"),
])
def test_each_impossible_setting_is_one_line(capsys, overrides, phrase):
    found = errors(capsys, *overrides)
    assert any(line.startswith(phrase) for line in found), found


def test_multi_turn_and_expert_parallel_runs_take_it(capsys):
    assert errors(capsys, *ON, config=str(ROOT / "configs" / "tiny_tool_grpo.yaml")) == []
    assert errors(capsys, *ON, config=str(ROOT / "configs" / "tiny_moe_grpo.yaml")) == []
