"""actor.router_replay (R2 / R3) at validation, and verl's keys for it: R3 loads on the tiny MoE preset, with the
native engine or SGLang (both return each token's experts); what it cannot serve (a dense model, full recompute at
pp > 1, an engine that returns no experts, partial rollouts, multi-turn) is one line each, naming the key, the value
and the fix, before anything is built."""
import pytest

from rlhf_mcore.config.load import ConfigError, load_config
from tests.support.paths import ROOT_STR as ROOT

MOE = f"{ROOT}/configs/tiny_moe_grpo.yaml"
DENSE = f"{ROOT}/configs/tiny_grpo.yaml"


def errors(path: str, *overrides: str, world_size: int = 1) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), world_size=world_size)
    return info.value.errors


def test_r3_loads_on_the_tiny_moe_preset():
    assert load_config(MOE, ["actor.router_replay=R3"], world_size=1).actor.router_replay == "R3"


def test_r3_loads_with_partial_rollouts():
    """Rounds re-route each row whole (rollout.partial.Sample.routing), so R3 takes partial rollouts."""
    cfg = load_config(MOE, ["actor.router_replay=R3", "async_training.partial_rollout=true",
                            "async_training.staleness_threshold=1"], world_size=1)
    assert cfg.async_training.partial_rollout and cfg.actor.router_replay == "R3"


def test_r3_loads_with_multi_turn_rollouts():
    """Each turn's call re-routes its row's whole prefix (rollout.modes.trajectory.Trajectory.routing)."""
    cfg = load_config(MOE, ["actor.router_replay=R3", "rollout.mode=multi_turn",
                            "rollout.multi_turn.tools=[calculator]"], world_size=1)
    assert cfg.rollout.mode == "multi_turn" and cfg.actor.router_replay == "R3"


REFUSALS = {
    "dense": (DENSE, ["actor.router_replay=R3"], 1,
              "actor.router_replay: needs an MoE model (got 'R3' with a dense model). Set actor.router_replay="
              "disabled."),
    "full recompute at pp2": (MOE, ["actor.router_replay=R3", "parallel.pp=2", "model.recompute=full"], 2,
                              "actor.router_replay: R3 cannot replay through full recompute at pp > 1 (got "
                              "model.recompute=full with pp=2). Use model.recompute=selective or none, or "
                              "parallel.pp=1."),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_r3_refusals_are_one_line_each(name):
    path, overrides, world_size, line = REFUSALS[name]
    assert line in errors(path, *overrides, world_size=world_size)


def test_r3_takes_the_experts_sglang_returns():
    from rlhf_mcore.config.validate import _r3_rollout_rules

    cfg = load_config(MOE, ["actor.router_replay=R3"], world_size=1)
    cfg.rollout.engine = "sglang"
    assert _r3_rollout_rules(cfg) == []


def test_r3_refuses_an_engine_that_returns_no_experts(monkeypatch):
    """The rule reads the engines' `records_routing` trait (here SGLang's is taken away)."""
    import dataclasses

    from rlhf_mcore.config.validate import _r3_rollout_rules
    from rlhf_mcore.rollout.base import ROLLOUT_ENGINES

    traits = ROLLOUT_ENGINES.traits
    monkeypatch.setattr(ROLLOUT_ENGINES, "traits", lambda name: dataclasses.replace(
        traits(name), records_routing=traits(name).records_routing and name != "sglang"))
    cfg = load_config(MOE, ["actor.router_replay=R3"], world_size=1)
    cfg.rollout.engine = "sglang"
    assert _r3_rollout_rules(cfg) == [
        "rollout.engine: actor.router_replay=R3 needs the rollout's experts, which only these engines return: "
        "native (got 'sglang'). Set rollout.engine to one of them, or actor.router_replay=R2."]


def test_r2_keeps_its_rules():
    assert "actor.router_replay: needs an MoE model (got 'R2' with a dense model). Set actor.router_replay=" \
           "disabled." in errors(DENSE, "actor.router_replay=R2")
    assert load_config(MOE, ["actor.router_replay=R2", "rollout.engine=native"], world_size=1)


@pytest.mark.parametrize("verl, ours", [
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=True"], "R3"),
    (["actor_rollout_ref.actor.router_replay.mode=R3"], "R3"),
    (["actor_rollout_ref.actor.router_replay.mode=R2", "actor_rollout_ref.rollout.enable_rollout_routing_replay=False"],
     "R2"),
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=False"], "disabled"),
])
def test_verl_keys_land_on_router_replay(verl, ours):
    notes: list[str] = []
    assert load_config(MOE, ["actor.router_replay=disabled", *verl], world_size=1, notes=notes).actor.router_replay \
        == ours
    if "enable_rollout_routing_replay=False" in verl[-1]:
        assert any("enable_rollout_routing_replay=False sets nothing" in n for n in notes), notes
