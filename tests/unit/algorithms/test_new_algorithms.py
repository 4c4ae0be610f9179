"""The estimators and losses added for verl parity, by hand: optimal token baseline (position- and
valid-token-aligned), SAPO's soft gate, bypass mode, verl's fixed aggregation for gspo/sapo/geo_mean."""
import math

import pytest
import torch

from rlhf_mcore.algorithms import ADVANTAGES, POLICY_LOSSES, AdvantageInputs, PolicyLossInputs, agg_mode_for


def otb_inputs(mask, rewards, pi, sum_pi2, groups, **kw):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return AdvantageInputs(token_level_rewards=t(rewards), response_mask=t(mask), old_logp=t(pi).log(),
                           sum_pi_squared=t(sum_pi2), group_index=torch.tensor(groups), **kw)


def test_optimal_token_baseline_by_hand():
    # two responses of one prompt: w_t = 1 - 2 pi + sum pi^2 = 1 - 1 + 0.5 = 0.5 everywhere -> W_t = 0.5 t
    inp = otb_inputs([[1, 1, 1], [1, 1, 0]], [[0, 0, 1.0], [0, 2.0, 0]], [[0.5] * 3] * 2, [[0.5] * 3] * 2, [0, 0])
    adv, returns = ADVANTAGES.get("optimal_token_baseline")(inp)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1, 1], [2, 2, 0]], dtype=torch.float64))
    # t=0,1: B = (1 * W + 2 * W) / (2 W) = 1.5; t=2: only response 0 -> B = 1 (eps 1e-8 aside)
    expected = torch.tensor([[-0.5, -0.5, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-7, rtol=0)


def test_tir_aligns_by_valid_token_and_zeroes_the_tail():
    # response 0 has a tool output (mask 0) at t=1; in valid-token order both start at their first token
    inp = otb_inputs([[1, 0, 1, 1], [1, 1, 0, 0]], [[0, 0, 0, 1.0], [0, 3.0, 0, 0]], [[0.5] * 4] * 2,
                     [[0.5] * 4] * 2, [7, 7])
    adv, _ = ADVANTAGES.get("tir_optimal_token_baseline")(inp)
    # valid-token index 0, 1: B = (1 + 3) / 2 = 2; index 2 only in response 0 (the unique longest): B = 0
    expected = torch.tensor([[-1.0, 0.0, -1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-7, rtol=0)


def test_singleton_group_keeps_its_return():
    inp = otb_inputs([[1, 1]], [[0, 2.0]], [[0.3, 0.3]], [[0.4, 0.4]], [3])
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        adv, returns = ADVANTAGES.get(name)(inp)
        torch.testing.assert_close(adv, returns)


def pl_inputs(log_ratio, adv, **kw):
    logp = torch.full((1, len(adv)), -1.0, dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor([log_ratio], dtype=torch.float64)
    return PolicyLossInputs(logp=logp, old_logp=old, advantages=torch.tensor([adv], dtype=torch.float64),
                            response_mask=torch.ones(1, len(adv)), **kw)


def test_sapo_gate_by_hand():
    inp = pl_inputs([0.0, math.log(2.0), 0.0], [1.0, 1.0, -1.0], tau_pos=1.0, tau_neg=2.0)
    loss, m = POLICY_LOSSES.get("sapo")(inp)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [-4 * sig(0.0), -4 * sig(1.0), 2 * sig(0.0)]  # -f(r) A, f = sigmoid(tau (r - 1)) 4 / tau
    torch.testing.assert_close(loss, torch.tensor([expected], dtype=torch.float64))
    loss.sum().backward()
    # d/dlogp = -A f'(r) r, f'(r) = 4 sigmoid(1 - sigmoid): 1 at r = 1 (the plain policy gradient)
    grad = [-1.0, -4 * sig(1.0) * (1 - sig(1.0)) * 2.0, 1.0]
    torch.testing.assert_close(inp.logp.grad, torch.tensor([grad], dtype=torch.float64))
    assert m["pg_clipfrac"].item() == 0.0


def test_bypass_mode_uses_rollout_logprobs_as_old_policy():
    inp = pl_inputs([5.0, 5.0], [1.0, -1.0])  # old_logp far away: must be ignored
    inp.rollout_logp = inp.logp.detach() - torch.tensor([[math.log(1.5), 0.0]], dtype=torch.float64)
    loss, _ = POLICY_LOSSES.get("bypass_mode")(inp)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.0]], dtype=torch.float64))  # clipped at 1 + 0.2
    inp.bypass_loss_type, inp.bypass_is_level, inp.bypass_is_threshold = "reinforce", "token", 1.2
    loss, m = POLICY_LOSSES.get("bypass_mode")(inp)
    torch.testing.assert_close(loss, torch.tensor([[1.2, -1.0]], dtype=torch.float64))  # -w A log pi, w <= 1.2
    assert m["ppo_kl"].item() == pytest.approx(-math.log(1.5) / 2)


def test_bypass_mode_needs_rollout_logprobs():
    with pytest.raises(ValueError, match="bypass_mode: needs the rollout log-probs"):
        POLICY_LOSSES.get("bypass_mode")(pl_inputs([0.0], [1.0]))


@pytest.mark.parametrize("name, mode", [("gspo", "seq-mean-token-mean"), ("sapo", "seq-mean-token-mean"),
                                        ("geo_mean", "seq-mean-all-rows"), ("vanilla", "token-mean")])
def test_verl_fixed_aggregation(name, mode):
    assert agg_mode_for(name, "token-mean") == mode
    assert agg_mode_for(name, "seq-mean-token-sum", honor_loss_agg_mode=True) == "seq-mean-token-sum"
