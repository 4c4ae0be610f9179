"""Estimators declare what they need where they register; roles, validation and the trainer ask the registry."""
import pytest

from rlhf_mcore.algorithms import ADVANTAGES, LOSS_AGG_MODES, AdvantageNeeds, estimator_needs
from rlhf_mcore.registry import Registry

NEEDS = {  # hand-written from each estimator's inputs (its `inp.require(...)` calls)
    "gae": AdvantageNeeds(critic=True),
    "remax": AdvantageNeeds(greedy_baseline=True),
    "reinforce_plus_plus": AdvantageNeeds(),
    "optimal_token_baseline": AdvantageNeeds(groups=True, sum_pi_squared=True),
    "tir_optimal_token_baseline": AdvantageNeeds(groups=True, sum_pi_squared=True),
    **{name: AdvantageNeeds(groups=True)
       for name in ("grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "gpg")},
}


def test_every_estimator_declares_its_needs():
    assert sorted(NEEDS) == ADVANTAGES.names()
    for name, needs in NEEDS.items():
        assert estimator_needs(name) == needs, name


def test_unknown_estimator_lists_the_names():
    with pytest.raises(ValueError, match=r"Did you mean 'grpo'\? Available: gae"):
        estimator_needs("grop")


def test_traits_need_a_declared_type_and_hidden_entries_are_no_choice():
    plain = Registry("thing")
    with pytest.raises(TypeError, match="declares no traits"):
        plain.register("a", critic=True)
    assert "seq-mean-all-rows" in LOSS_AGG_MODES and "seq-mean-all-rows" not in LOSS_AGG_MODES.choices()
    assert LOSS_AGG_MODES.choices()[0] == "token-mean"  # registration order


def test_registry_needs_reach_the_roles():
    from types import SimpleNamespace as N

    from rlhf_mcore.trainer.roles import needs_critic

    assert needs_critic(N(algorithm=N(adv_estimator="gae")))
    assert not needs_critic(N(algorithm=N(adv_estimator="grpo")))
