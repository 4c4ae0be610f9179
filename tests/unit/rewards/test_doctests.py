"""Every registered reward function documents itself with a doctest (tests/unit/test_doctests.py runs them)."""
import rlhf_mcore.rewards as rewards


def test_every_registered_reward_has_a_doctest():
    for data_source in rewards.REWARDS:
        fn = rewards.get_reward_fn(data_source)
        assert ">>> " in (fn.__doc__ or ""), f"reward {data_source} ({fn.__name__}) has no doctest"
