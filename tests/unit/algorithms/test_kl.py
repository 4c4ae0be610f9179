"""KL estimators, straight-through variants, KL-shaped rewards and the KL controllers."""
import math

import pytest
import torch

from rlhf_mcore.algorithms import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
)

LOGP = [-1.0, -2.0]
REF = [-1.5, -1.0]  # log r = ref - logp = (-0.5, 1.0)
K3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
VALUES = {"k1": [0.5, -1.0], "kl": [0.5, -1.0], "abs": [0.5, 1.0], "k2": [0.125, 0.5], "mse": [0.125, 0.5],
          "k3": K3, "low_var_kl": K3}
GRADS = {"k1": [1.0, 1.0], "abs": [1.0, -1.0], "k2": [0.5, -1.0],
         "k3": [1 - math.exp(-0.5), 1 - math.exp(1.0)]}  # d/dlogp
GRADS.update(kl=GRADS["k1"], mse=GRADS["k2"], low_var_kl=GRADS["k3"])


def run(kind):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(REF, dtype=torch.float64, requires_grad=True)
    kl = kl_penalty(logp, ref, kind)
    kl.sum().backward()
    assert ref.grad is None  # the reference never gets a gradient
    return kl.detach().tolist(), logp.grad.tolist()


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_estimator_values_and_gradients(kind):
    value, grad = run(kind)
    assert value == pytest.approx(VALUES[kind])
    assert grad == pytest.approx(GRADS[kind])


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_straight_through_value_of_named_gradient_of_k2(kind):
    value, grad = run(kind + "+")
    assert value == pytest.approx(VALUES[kind])
    assert grad == pytest.approx(GRADS["k2"])  # logp - ref


def test_apply_kl_penalty_shapes_token_rewards():
    scores = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    logp = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]], requires_grad=True)
    ref = logp.detach() - torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, 0.2, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    rewards, m = apply_kl_penalty(scores, logp, ref, mask, coef=0.5, kind="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85, 0.0], [-0.2, 1.9, 0.0, 0.0]]))
    assert not rewards.requires_grad
    assert m["kl"].item() == pytest.approx((0.2 + 0.3) / 2)  # mean of per-sequence token means
    assert m["kl_coef"].item() == pytest.approx(0.5)


def test_adaptive_controller_follows_ziegler_rule():
    ctl = KL_CONTROLLERS.get("adaptive")(value=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, num_steps=256)  # error clip(9/6 - 1) = +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    ctl.update(current_kl=6.6, num_steps=100)  # error +0.1, inside the clip
    v = 0.1 * (1 + 0.2 * 256 / 10000) * (1 + 0.1 * 100 / 10000)
    assert ctl.value == pytest.approx(v)
    ctl.update(current_kl=0.0, num_steps=100)  # error clip(-1) = -0.2
    v *= 1 - 0.2 * 100 / 10000
    assert ctl.value == pytest.approx(v)
    restored = AdaptiveKLController(value=1.0, target_kl=1.0, horizon=1.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.state_dict() == ctl.state_dict() and isinstance(restored.value, float)


def test_fixed_controller_and_bad_adaptive_settings():
    ctl = FixedKLController(value=0.05)
    ctl.update(current_kl=100.0, num_steps=10)
    assert ctl.value == 0.05
    ctl.load_state_dict({"value": 0.2})
    assert ctl.state_dict() == {"value": 0.2}
    with pytest.raises(ValueError, match="kl_horizon"):
        AdaptiveKLController(value=0.1, target_kl=6.0, horizon=0)


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError, match=r"Did you mean 'low_var_kl'.*Available: abs, abs\+, k1"):
        KL_ESTIMATORS.get("low_varkl")
