"""Every algorithm registry: the names users type, duplicates rejected, unknown names answered helpfully."""
import pytest

from rlhf_mcore.algorithms import (
    ADVANTAGES,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    MISMATCH_LEVELS,
    MISMATCH_MODES,
    POLICY_LOSSES,
)

EXPECTED_NAMES = {
    "ADVANTAGES": (ADVANTAGES, ["gae", "gpg", "grpo", "grpo_passk", "opo", "optimal_token_baseline",
                                "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo",
                                "tir_optimal_token_baseline"]),
    "POLICY_LOSSES": (POLICY_LOSSES, ["bypass_mode", "cispo", "clip_cov", "geo_mean", "gpg", "gspo", "kl_cov",
                                      "sapo", "vanilla"]),
    "KL_ESTIMATORS": (KL_ESTIMATORS, sorted(n + s for n in ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
                                            for s in ("", "+"))),
    "LOSS_AGG_MODES": (LOSS_AGG_MODES, ["seq-mean-all-rows", "seq-mean-token-mean", "seq-mean-token-sum",
                                        "seq-mean-token-sum-norm", "token-mean"]),
    "KL_CONTROLLERS": (KL_CONTROLLERS, ["adaptive", "fixed"]),
    "MISMATCH_LEVELS": (MISMATCH_LEVELS, ["sequence", "token"]),
    "MISMATCH_MODES": (MISMATCH_MODES, ["mask", "truncate"]),
}


@pytest.mark.parametrize("key", sorted(EXPECTED_NAMES))
def test_registered_names(key):
    """The names users type stay (a new entry may join: its own test covers it)."""
    registry, names = EXPECTED_NAMES[key]
    assert set(names) <= set(registry.names()) and registry.names() == sorted(registry.names())


@pytest.mark.parametrize("key", sorted(EXPECTED_NAMES))
def test_duplicate_registration_raises(key):
    registry, names = EXPECTED_NAMES[key]
    before = registry.names()
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(names[0])(lambda inp: inp)
    assert registry.names() == before  # the failed registration left nothing behind


def test_unknown_names_suggest_and_list():
    with pytest.raises(ValueError, match=r"unknown advantage estimator .*'grop'\. Did you mean 'grpo'\? "
                                         r"Available: gae, (\w+, )*grpo, grpo_passk, (\w+, )*rloo"):
        ADVANTAGES.get("grop")
    with pytest.raises(ValueError, match=r"actor.policy_loss.*Did you mean 'vanilla'"):
        POLICY_LOSSES.get("vanila")
    with pytest.raises(ValueError, match=r"actor.loss_agg_mode.*Did you mean 'token-mean'"):
        LOSS_AGG_MODES.get("token_mean")
