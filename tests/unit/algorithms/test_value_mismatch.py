"""Clipped value loss and rollout/trainer mismatch weights against hand-computed values."""
import math

import pytest
import torch

from rlhf_mcore.algorithms import compute_mismatch_weights, compute_value_loss


def test_clipped_value_loss():
    # t0: V moved 0.5 below V_old, clip keeps it at 0.8: max(0.25, 0.64) -> 0.32 (clipped wins, no gradient)
    # t1: max((2 - 1)^2, (1.2 - 1)^2) = 1 -> 0.5;  t2: padding
    values = torch.tensor([[0.5, 2.0, 5.0]], requires_grad=True)
    returns = torch.tensor([[0.0, 1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, m = compute_value_loss(values, returns, old, mask, cliprange_value=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.32, 0.5, 0.0]]))
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)
    assert m["vpred_mean"].item() == pytest.approx(1.25)
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 1.0, 0.0]]))
    assert returns.grad is None and old.grad is None


def test_value_loss_without_clipping():
    values = torch.tensor([[0.5, 2.0]])
    loss, m = compute_value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), None)
    torch.testing.assert_close(loss, torch.tensor([[0.125, 2.0]]))
    assert m["vf_clipfrac"].item() == 0.0


# w_t = pi_old / pi_rollout = 3, 0.5, 1.2 (+ padding)
OLD = torch.tensor([[math.log(3.0), math.log(0.5), math.log(1.2), 4.0]]) - 2.0
ROLLOUT = torch.full((1, 4), -2.0)
MASK = torch.tensor([[1, 1, 1, 0]])


@pytest.mark.parametrize("level, mode, low, high, expected, frac", [
    ("token", "truncate", 0.0, 2.0, [2.0, 0.5, 1.2, 0.0], 1 / 3),
    ("token", "mask", 0.0, 2.0, [0.0, 0.5, 1.2, 0.0], 1 / 3),
    ("token", "mask", 0.6, 2.0, [0.0, 0.0, 1.2, 0.0], 2 / 3),
    ("token", "truncate", 0.6, 2.0, [2.0, 0.6, 1.2, 0.0], 2 / 3),
    ("sequence", "truncate", 0.0, 2.0, [1.8, 1.8, 1.8, 0.0], 0.0),  # 3 * 0.5 * 1.2
    ("sequence", "truncate", 0.0, 1.5, [1.5, 1.5, 1.5, 0.0], 1.0),
    ("sequence", "mask", 0.0, 1.5, [0.0, 0.0, 0.0, 0.0], 1.0),
])
def test_mismatch_weights(level, mode, low, high, expected, frac):
    w, m = compute_mismatch_weights(OLD, ROLLOUT, MASK, level=level, mode=mode, threshold=high, threshold_low=low)
    torch.testing.assert_close(w, torch.tensor([expected]))
    assert m[f"mismatch_{mode}_frac"].item() == pytest.approx(frac)


def test_mismatch_metrics():
    old = OLD.clone().requires_grad_(True)
    w, m = compute_mismatch_weights(old, ROLLOUT, MASK)
    assert not w.requires_grad
    log_w = [math.log(3.0), math.log(0.5), math.log(1.2)]
    assert m["mismatch_logp_abs_diff"].item() == pytest.approx(sum(abs(x) for x in log_w) / 3, rel=1e-5)
    assert m["mismatch_kl_k1"].item() == pytest.approx(-math.log(1.8) / 3, rel=1e-5)
    k3 = sum(math.exp(x) - 1 - x for x in log_w) / 3
    assert m["mismatch_kl_k3"].item() == pytest.approx(k3, rel=1e-5)
    assert m["mismatch_first_abs_diff"].item() == pytest.approx(math.log(3.0), rel=1e-5)
    assert m["mismatch_exact_frac"].item() == 0.0
    assert m["is_weight_mean"].item() == pytest.approx(3.7 / 3, rel=1e-5)
    assert m["is_weight_max"].item() == pytest.approx(2.0)
    _, m = compute_mismatch_weights(torch.tensor([[-1.0, -2.0, -3.0, 0.0]]), torch.tensor([[-1.0, -2.5, -3.0, 9.0]]),
                                    MASK)
    assert m["mismatch_exact_frac"].item() == pytest.approx(2 / 3)  # the padding column does not count
    assert m["mismatch_first_abs_diff"].item() == 0.0
    # the trainer's layout: [B, prompt + response], the first response token anywhere in the row
    old_lp, roll_lp = torch.tensor([[0.0, -1.0, -2.0, -3.0]]), torch.tensor([[5.0, -1.5, -2.0, -3.25]])
    _, m = compute_mismatch_weights(old_lp, roll_lp, torch.tensor([[0, 1, 1, 1]]))
    assert m["mismatch_first_abs_diff"].item() == pytest.approx(0.5)
    assert m["mismatch_logp_abs_diff"].item() == pytest.approx(0.75 / 3)


def test_mismatch_rejects_bad_threshold_and_names():
    with pytest.raises(ValueError, match="threshold"):
        compute_mismatch_weights(OLD, ROLLOUT, MASK, threshold=0.5, threshold_low=1.0)
    with pytest.raises(ValueError, match="Did you mean 'sequence'"):
        compute_mismatch_weights(OLD, ROLLOUT, MASK, level="sequense")
