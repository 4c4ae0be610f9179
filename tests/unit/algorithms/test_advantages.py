"""Advantage estimators against hand-computed values (padding, groups of different sizes)."""
import math

import pytest
import torch

from rlhf_mcore.algorithms import ADVANTAGES, AdvantageInputs, discounted_returns, gae_advantages

# Eight responses, T = 4. Outcome reward on the last valid token.
#   group 7: seqs 0, 1, 2 (scores 1, 0, 1)    group 3: seqs 3, 4 (scores 2, 0.5)
#   group 42: seq 5 alone (score 3)            group 5: seqs 6, 7 (scores 1, 1: no signal)
LENGTHS = [3, 2, 4, 1, 3, 2, 2, 4]
SCORES = [1.0, 0.0, 1.0, 2.0, 0.5, 3.0, 1.0, 1.0]
GROUPS = [7, 7, 7, 3, 3, 42, 5, 5]


def outcome_batch(**kw) -> AdvantageInputs:
    mask = torch.zeros(8, 4)
    rewards = torch.full((8, 4), 9.0)  # garbage at padding must be ignored
    for i, (n, s) in enumerate(zip(LENGTHS, SCORES)):
        mask[i, :n] = 1
        rewards[i, :n] = 0.0
        rewards[i, n - 1] = s
    return AdvantageInputs(token_level_rewards=rewards, response_mask=mask,
                           group_index=torch.tensor(GROUPS), **kw)


def per_seq(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The one advantage of each sequence, after checking it is constant on valid tokens and 0 on padding."""
    out = []
    for row, m in zip(adv, mask.bool()):
        assert torch.all(row[~m] == 0)
        assert torch.allclose(row[m], row[m][0].expand(int(m.sum())))
        out.append(row[m][0].item())
    return out


S3 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1)
S2 = math.sqrt(1.125)  # unbiased std of (2, 0.5)

EXPECTED = {
    "grpo": [(1 / 3) / S3, (-2 / 3) / S3, (1 / 3) / S3, 0.75 / S2, -0.75 / S2, 3.0, 0.0, 0.0],
    "rloo": [0.5, -1.0, 0.5, 1.5, -1.5, 3.0, 0.0, 0.0],
    # baselines: group 7 (3*1 + 2*0 + 4*1) / 9 = 7/9; group 3 (1*2 + 3*0.5) / 4 = 0.875
    "opo": [2 / 9, -7 / 9, 2 / 9, 1.125, -0.375, 3.0, 0.0, 0.0],
    # verl: alpha = B / #nonzero scores = 8 / 7
    "gpg": [8 / 21, -16 / 21, 8 / 21, 6 / 7, -6 / 7, 24 / 7, 0.0, 0.0],
    # best minus second best, only for the (first) best: group 7 ties, group 3 gives 1.5
    "grpo_passk": [0.0, 0.0, 0.0, 1.5 / S2, 0.0, 0.0, 0.0, 0.0],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_outcome_estimators_hand_values(name):
    inp = outcome_batch()
    adv, returns = ADVANTAGES.get(name)(inp)
    assert per_seq(adv, inp.response_mask) == pytest.approx(EXPECTED[name], abs=1e-5)
    assert torch.equal(adv, returns)


def test_gpg_paper_alpha():
    # alpha = B / (B - M) = 8 / 6: group 5 (two equal rewards) is uninformative
    inp = outcome_batch(gpg_paper_alpha=True)
    adv, _ = ADVANTAGES.get("gpg")(inp)
    assert per_seq(adv, inp.response_mask) == pytest.approx([4 / 9, -8 / 9, 4 / 9, 1.0, -1.0, 4.0, 0.0, 0.0])


def test_dr_grpo_drops_std():
    inp = outcome_batch(norm_adv_by_std=False)
    adv, _ = ADVANTAGES.get("grpo")(inp)
    assert per_seq(adv, inp.response_mask) == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.75, -0.75, 3.0, 0, 0])


def test_passk_picks_the_best_of_distinct_scores():
    rewards = torch.tensor([[0.2], [0.9], [0.5]])
    inp = AdvantageInputs(token_level_rewards=rewards, response_mask=torch.ones(3, 1),
                          group_index=torch.tensor([0, 0, 0]), norm_adv_by_std=False)
    adv, _ = ADVANTAGES.get("grpo_passk")(inp)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.4, 0.0])


def test_reinforce_plus_plus_baseline_whitens_over_tokens():
    inp = outcome_batch()
    adv, _ = ADVANTAGES.get("reinforce_plus_plus_baseline")(inp)
    centred = [1 / 3, -2 / 3, 1 / 3, 0.75, -0.75, 3.0, 0.0, 0.0]  # score - group mean
    tokens = torch.tensor([c for c, n in zip(centred, LENGTHS) for _ in range(n)], dtype=torch.float64)
    expected = (torch.tensor(centred, dtype=torch.float64) - tokens.mean()) / (tokens.var() + 1e-8).sqrt()
    assert per_seq(adv, inp.response_mask) == pytest.approx(expected.tolist(), abs=1e-5)
    assert adv[inp.response_mask.bool()].mean().abs() < 1e-6


@pytest.mark.parametrize("through", [False, True])
def test_reinforce_plus_plus_returns_at_masked_tokens(through):
    # seq 0: r = (0.1, 0.2, 1.0), padding; seq 1: the same with a masked (tool) token at t = 1
    rewards = torch.tensor([[0.1, 0.2, 1.0, 5.0], [0.1, 7.0, 0.2, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
    adv, returns = ADVANTAGES.get("reinforce_plus_plus")(
        AdvantageInputs(token_level_rewards=rewards, response_mask=mask, gamma=0.5, returns_through_masked=through))
    # G = (0.1 + 0.5 * 0.7, 0.2 + 0.5 * 1.0, 1.0); verl restarts G at the tool token: G_0 = 0.1
    first = 0.45 if through else 0.1
    expected = torch.tensor([[0.45, 0.7, 1.0, 0.0], [first, 0.0, 0.7, 1.0]])
    torch.testing.assert_close(returns, expected)
    valid = torch.tensor([0.45, 0.7, 1.0, first, 0.7, 1.0], dtype=torch.float64)
    white = ((valid - valid.mean()) / (valid.var() + 1e-8).sqrt()).float()
    torch.testing.assert_close(adv[mask.bool()], white)
    assert torch.all(adv[~mask.bool()] == 0)


def test_remax_subtracts_greedy_baseline():
    rewards = torch.tensor([[0.1, 0.2, 1.0, 0.0]])
    inp = AdvantageInputs(token_level_rewards=rewards, response_mask=torch.tensor([[1, 1, 1, 0]]),
                          baseline_rewards=torch.tensor([0.6]))
    adv, returns = ADVANTAGES.get("remax")(inp)
    torch.testing.assert_close(returns, torch.tensor([[1.3, 1.2, 1.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.7, 0.6, 0.4, 0.0]]))


def test_gae_hand_values():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 0.4, 0.6, 9.0]])
    inp = AdvantageInputs(token_level_rewards=rewards, values=values, response_mask=torch.tensor([[1, 1, 1, 0]]),
                          gamma=0.9, lam=0.8, whiten_gae=False)
    adv, returns = ADVANTAGES.get("gae")(inp)
    # deltas: -0.14, 0.14, 0.4; A2 = 0.4, A1 = 0.14 + 0.72 * 0.4, A0 = -0.14 + 0.72 * A1
    torch.testing.assert_close(adv, torch.tensor([[0.16816, 0.428, 0.4, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.66816, 0.828, 1.0, 0.0]]))
    white, returns_w = ADVANTAGES.get("gae")(AdvantageInputs(
        token_level_rewards=rewards, values=values, response_mask=inp.response_mask, gamma=0.9, lam=0.8))
    torch.testing.assert_close(returns_w, returns)  # returns use the raw advantages
    raw = torch.tensor([0.16816, 0.428, 0.4], dtype=torch.float64)
    torch.testing.assert_close(white[0, :3], ((raw - raw.mean()) / (raw.var() + 1e-8).sqrt()).float())


def gae_loop(rewards, values, mask, gamma, lam):
    """Per-sequence scalar loop over the valid tokens only, straight from the definition."""
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_v = values[b, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            running = delta + gamma * lam * running
            out[b, t] = running
    return out


def test_gae_and_returns_match_python_loop_with_holes():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(5, 9, generator=g), torch.randn(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.3
    mask[0] = False  # an empty response
    expected = gae_loop(rewards, values, mask, 0.95, 0.9)
    torch.testing.assert_close(gae_advantages(rewards, values, mask, 0.95, 0.9), expected)
    # lambda = 1, V = 0 turns GAE into discounted returns
    torch.testing.assert_close(discounted_returns(rewards, mask, 0.95),
                               gae_loop(rewards, torch.zeros_like(values), mask, 0.95, 1.0))
    torch.testing.assert_close(discounted_returns(rewards, mask, 1.0),
                               gae_loop(rewards, torch.zeros_like(values), mask, 1.0, 1.0))


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_advantages_carry_no_gradient(name):
    inp = outcome_batch()
    inp.token_level_rewards.requires_grad_(True)
    inp.values = torch.randn(8, 4, requires_grad=True)
    inp.baseline_rewards = torch.randn(8, requires_grad=True)
    inp.old_logp = -torch.rand(8, 4, requires_grad=True)
    inp.sum_pi_squared = torch.rand(8, 4, requires_grad=True)
    adv, returns = ADVANTAGES.get(name)(inp)
    assert not adv.requires_grad and not returns.requires_grad
    assert torch.isfinite(adv).all() and torch.all(adv[~inp.response_mask.bool()] == 0)


@pytest.mark.parametrize("name, field", [("gae", "values"), ("grpo", "group_index"), ("remax", "baseline_rewards")])
def test_missing_input_says_what_to_pass(name, field):
    inp = AdvantageInputs(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=f"adv_estimator={name}: needs AdvantageInputs.{field}"):
        ADVANTAGES.get(name)(inp)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="group_index"):
        AdvantageInputs(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3),
                        group_index=torch.zeros(3, dtype=torch.long))
