"""Estimators declare what they need where they register; roles, validation and the trainer ask the registry."""
import pytest
import torch

from rlhf_mcore.algorithms import ADVANTAGES, LOSS_AGG_MODES, AdvantageInputs, AdvantageNeeds, estimator_needs
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
    assert set(NEEDS) <= set(ADVANTAGES.names())  # a new estimator is covered by the test below
    for name, needs in NEEDS.items():
        assert estimator_needs(name) == needs, name


# each need and the AdvantageInputs fields an estimator reads (with `inp.require`) when it has that need
NEED_FIELDS = {"critic": ("values",), "groups": ("group_index",), "greedy_baseline": ("baseline_rewards",),
               "sum_pi_squared": ("old_logp", "sum_pi_squared")}


def full_inputs(**drop) -> AdvantageInputs:
    """Two prompts x 3 samples, T = 4, with every optional field set (except those named in `drop`)."""
    gen = torch.Generator().manual_seed(0)
    mask = (torch.arange(4) < torch.tensor([4, 3, 2, 4, 1, 3])[:, None]).float()
    fields = dict(values=torch.rand(6, 4, generator=gen), group_index=torch.tensor([0, 0, 0, 1, 1, 1]),
                  baseline_rewards=torch.rand(6, generator=gen), old_logp=-torch.rand(6, 4, generator=gen),
                  sum_pi_squared=torch.rand(6, 4, generator=gen) * 0.5 + 0.1)
    for field in drop:
        fields[field] = None
    return AdvantageInputs(token_level_rewards=torch.rand(6, 4, generator=gen) * mask, response_mask=mask, **fields)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_declared_needs_are_the_inputs_it_requires(name):
    """Behaviour, not a list: an estimator fails without a field exactly when it declared the need for it."""
    estimator, declared = ADVANTAGES.get(name), estimator_needs(name)
    estimator(full_inputs())
    for need, fields in NEED_FIELDS.items():
        try:
            estimator(full_inputs(**dict.fromkeys(fields)))
            required = False
        except ValueError as e:
            required = "needs AdvantageInputs." in str(e)
        assert required == getattr(declared, need), (name, need)


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
