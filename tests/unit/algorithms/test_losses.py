"""Policy losses: hand-computed values, metrics, and where gradients may flow."""
import math

import pytest
import torch

from rlhf_mcore.algorithms import POLICY_LOSSES, PolicyLossInputs, aggregate_loss, compute_entropy_bonus

LN = math.log


def inputs(log_ratio, adv, mask=None, logp=None, **kw) -> PolicyLossInputs:
    log_ratio = torch.tensor(log_ratio, dtype=torch.float64)
    logp = torch.tensor(logp, dtype=torch.float64) if logp is not None else torch.full_like(log_ratio, -1.0)
    logp.requires_grad_(True)
    adv = torch.tensor(adv, dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(log_ratio) if mask is None else torch.tensor(mask, dtype=torch.float64)
    old = (logp.detach() - log_ratio).requires_grad_(True)
    return PolicyLossInputs(logp=logp, old_logp=old, advantages=adv, response_mask=mask, **kw)


def grad_of(loss: torch.Tensor, inp: PolicyLossInputs) -> torch.Tensor:
    loss.sum().backward()
    assert inp.advantages.grad is None and inp.old_logp.grad is None  # only logp gets a gradient
    return inp.logp.grad


def test_vanilla_clip_higher_and_dual_clip():
    # ratios 1.5, 0.5, 1.1, 4.0 (+ padding); advantages 1, 1, -1, -2
    inp = inputs([[LN(1.5), LN(0.5), LN(1.1), LN(4.0), 3.0]], [[1.0, 1.0, -1.0, -2.0, 5.0]],
                 mask=[[1, 1, 1, 1, 0]], clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    loss, m = POLICY_LOSSES.get("vanilla")(inp)
    # t0 clipped at 1 + 0.28; t1 unclipped; t2 unclipped; t3: max(8, 2.56) = 8 capped by dual clip 3 * 2 = 6
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5, 1.1, 6.0, 0.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)
    assert m["ppo_kl"].item() == pytest.approx(-(LN(1.5) + LN(0.5) + LN(1.1) + LN(4.0)) / 4)
    assert [m[k].item() for k in ("ratio_mean", "ratio_max", "ratio_min")] == pytest.approx([1.775, 4.0, 0.5])
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    # d/dlogp of -A r is -A r where unclipped, 0 where clipped or dual-clipped
    torch.testing.assert_close(grad_of(loss, inp), torch.tensor([[0.0, -0.5, 1.1, 0.0, 0.0]], dtype=torch.float64))


def test_vanilla_asymmetric_lower_bound_and_no_dual_clip():
    inp = inputs([[LN(0.7), LN(4.0)]], [[-1.0, -2.0]], clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None)
    loss, m = POLICY_LOSSES.get("vanilla")(inp)
    torch.testing.assert_close(loss, torch.tensor([[0.8, 8.0]], dtype=torch.float64))  # max(0.7, 0.8), max(8, 2.56)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5) and m["pg_clipfrac_lower"].item() == 0.0


def test_gspo_sequence_ratio_token_gradient():
    # seq 0: token log-ratios (0.1, 0.3) -> s = e^0.2 > 1.2, clipped for A > 0; seq 1: s = 1 for A < 0.
    inp = inputs([[0.1, 0.3, 0.0], [-0.2, 0.0, 0.2]], [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]],
                 mask=[[1, 1, 0], [1, 1, 1]], clip_ratio_low=0.2, clip_ratio_high=0.2)
    loss, m = POLICY_LOSSES.get("gspo")(inp)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.2, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(0.4)
    torch.testing.assert_close(grad_of(loss, inp), torch.tensor([[0, 0, 0], [1.0, 1, 1]], dtype=torch.float64))
    # unclipped side: A < 0 with s = e^0.2 -> each token's gradient is -A s (GSPO-token, sg on s)
    inp = inputs([[0.1, 0.3]], [[-1.0, -1.0]])
    loss, _ = POLICY_LOSSES.get("gspo")(inp)
    torch.testing.assert_close(grad_of(loss, inp), torch.full((1, 2), math.exp(0.2), dtype=torch.float64))


def test_gpg_is_plain_policy_gradient():
    inp = inputs([[0.3, -0.2]], [[2.0, -1.0]], logp=[[-1.0, -2.0]])
    loss, m = POLICY_LOSSES.get("gpg")(inp)
    torch.testing.assert_close(loss, torch.tensor([[2.0, -2.0]], dtype=torch.float64))
    torch.testing.assert_close(grad_of(loss, inp), torch.tensor([[-2.0, 1.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == 0.0


def test_cispo_truncates_weight_keeps_gradient():
    inp = inputs([[LN(1.5), LN(0.5)]], [[1.0, -2.0]], logp=[[-1.0, -2.0]], clip_ratio_low=1.0, clip_ratio_high=0.28)
    loss, m = POLICY_LOSSES.get("cispo")(inp)
    # weights sg(min(r, 1.28)) = 1.28, 0.5; loss = -w A logp
    torch.testing.assert_close(loss, torch.tensor([[1.28, -2.0]], dtype=torch.float64))
    torch.testing.assert_close(grad_of(loss, inp), torch.tensor([[-1.28, 1.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(0.5) and m["pg_clipfrac_lower"].item() == 0.0


@pytest.mark.parametrize("sign, expected_log, clamped", [(1.0, 0.5 / 3, [True, False, False]),
                                                         (-1.0, 0.6 / 3, [False, False, False])])
def test_geo_mean_sign_aware_log_clip(sign, expected_log, clamped):
    # log-ratios 0.5, -0.1, 0.2 with bounds 0.4: A > 0 clamps 0.5 -> 0.4; A < 0 keeps it (max of the two)
    inp = inputs([[0.5, -0.1, 0.2, 0.0]], [[sign] * 3 + [0.0]], mask=[[1, 1, 1, 0]],
                 clip_ratio_low=0.4, clip_ratio_high=0.4)
    loss, m = POLICY_LOSSES.get("geo_mean")(inp)
    seq_loss = -sign * math.exp(expected_log)
    torch.testing.assert_close(loss, torch.tensor([[seq_loss] * 3 + [0.0]], dtype=torch.float64))
    assert m["pg_clipfrac" if sign > 0 else "pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    loss_sum, count, _ = aggregate_loss(loss, inp.response_mask, "seq-mean-token-mean")
    (loss_sum / count).backward()
    g = -sign * math.exp(expected_log) / 3  # d/dlogp_t of -A exp(mean_t term), 0 where clamped
    expected = torch.tensor([[0.0 if c else g for c in clamped] + [0.0]], dtype=torch.float64)
    torch.testing.assert_close(inp.logp.grad, expected)


def kl_cov_case(**kw):
    # A = (1, -1, 2, 0), logp = (-1, -3, -0.5, -2): centred products 0.3125, 2.0625, 1.6875, 0.1875
    return inputs([[0.1, -0.2, 0.3, 0.05]], [[1.0, -1.0, 2.0, 0.0]], logp=[[-1.0, -3.0, -0.5, -2.0]], **kw)


def test_kl_cov_penalises_top_covariance_tokens():
    inp = kl_cov_case(kl_cov_ratio=0.5, kl_cov_coef=1.0)
    loss, m = POLICY_LOSSES.get("kl_cov")(inp)
    e = math.exp
    expected = [[-e(0.1), e(-0.2) + 0.2, -2 * e(0.3) + 0.3, 0.0]]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert m["kl_cov_frac"].item() == pytest.approx(0.5)


def test_clip_cov_cuts_gradient_of_selected_tokens():
    # window (1, 3) holds tokens 1 and 2; ratio 1.0 cuts every eligible token
    inp = kl_cov_case(clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=3.0, clip_ratio_low=0.5, clip_ratio_high=0.5)
    loss, m = POLICY_LOSSES.get("clip_cov")(inp)
    e = math.exp
    torch.testing.assert_close(loss, torch.tensor([[-e(0.1), 0.0, 0.0, 0.0]], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)  # verl reports the cut fraction as pg_clipfrac
    torch.testing.assert_close(grad_of(loss, inp), torch.tensor([[-e(0.1), 0, 0, 0]], dtype=torch.float64))
    # ratio 0.25 of 4 tokens -> exactly one of the two eligible tokens is cut, chosen by the generator
    cut = set()
    for seed in range(8):
        inp = kl_cov_case(clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=3.0, clip_ratio_low=0.5,
                          clip_ratio_high=0.5, generator=torch.Generator().manual_seed(seed))
        loss, m = POLICY_LOSSES.get("clip_cov")(inp)
        zeros = (loss[0] == 0).nonzero().flatten().tolist()
        assert len(zeros) == 2 and zeros[0] in (1, 2) and zeros[1] == 3  # token 3 has A = 0
        assert m["pg_clipfrac"].item() == pytest.approx(0.25)
        cut.add(zeros[0])
    assert cut == {1, 2}


def test_is_weights_scale_the_loss_without_gradient():
    w = torch.tensor([[2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    inp = inputs([[0.0, 0.0]], [[1.0, 1.0]], is_weights=w)
    loss, _ = POLICY_LOSSES.get("vanilla")(inp)
    torch.testing.assert_close(loss, torch.tensor([[-2.0, -0.5]], dtype=torch.float64))
    grad_of(loss, inp)
    assert w.grad is None


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_zero_on_padding_and_reports_metrics(name):
    g = torch.Generator().manual_seed(1)
    inp = inputs(torch.randn(3, 5, generator=g).mul(0.3).tolist(), torch.randn(3, 5, generator=g).tolist(),
                 mask=[[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bypass_is_level="token")
    inp.rollout_logp = inp.old_logp.detach() + 0.1
    loss, m = POLICY_LOSSES.get(name)(inp)
    assert loss.shape == (3, 5) and torch.all(loss[inp.response_mask == 0] == 0) and torch.isfinite(loss).all()
    assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean", "ratio_max", "ratio_min"} <= set(m)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    grad = grad_of(loss, inp)
    assert torch.all(grad[inp.response_mask == 0] == 0)


def test_bad_dual_clip_is_rejected():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        inputs([[0.0]], [[1.0]], clip_ratio_c=0.5)


def test_entropy_bonus():
    entropy = torch.tensor([[1.0, 2.0, 7.0]], requires_grad=True)
    term, m = compute_entropy_bonus(entropy, torch.tensor([[1, 1, 0]]), 0.01)
    torch.testing.assert_close(term, torch.tensor([[-0.01, -0.02, 0.0]]))
    assert m["entropy"].item() == pytest.approx(1.5)
