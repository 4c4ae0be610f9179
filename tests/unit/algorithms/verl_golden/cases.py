"""Seeded float64 inputs and the variants compared with verl (shared by gen_golden.py and the parity test).

Each case covers: ragged responses, an all-masked row, masked gaps inside responses (multi-turn tool
outputs), groups of sizes 1-8 given in shuffled, non-contiguous ids, all-equal groups, and log-ratios
|log r| > 20 for the policy losses and KL estimators. Rewards are 0 at mask-0 positions, as verl's
trainer produces them (score on the last valid token, KL penalty multiplied by the mask).
"""
from __future__ import annotations

import torch

# verl ActorConfig fields used by the policy losses (clip-higher, dual clip, SAPO temperatures)
ACTOR = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
         "tau_pos": 1.0, "tau_neg": 1.05}
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
# (policy loss, loss_agg_mode, with rollout IS weights, bypass_mode rollout_correction settings)
POLICY_VARIANTS = (
    [("vanilla", mode, is_w, {}) for mode in MODES for is_w in (False, True)]
    + [(name, mode, is_w, {}) for name in ("gpg", "cispo", "clip_cov", "kl_cov")
       for mode in ("token-mean", "seq-mean-token-mean") for is_w in (False, True)]
    + [(name, "token-mean", is_w, {}) for name in ("gspo", "sapo", "geo_mean") for is_w in (False, True)]
    + [("bypass_mode", mode, False, {"loss_type": "ppo_clip"}) for mode in ("token-mean", "seq-mean-token-mean")]
    + [("bypass_mode", "token-mean", False, {"loss_type": "reinforce", "rollout_is": level,
                                             "rollout_is_threshold": 2.0}) for level in ("token", "sequence")]
    + [("bypass_mode", "seq-mean-token-sum", False, {"loss_type": "reinforce"})]
)
# value-loss aggregation modes compared besides token-mean (critic.loss_agg_mode; sum-norm: L = the mask width)
VALUE_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# estimator -> verl's default handle_zero_tail (the only one its trainer uses); each run with and without IS weights
OTB_ZERO_TAIL = {"optimal_token_baseline": False, "tir_optimal_token_baseline": True}

CASES = {
    "sizes_1_to_8": {"seed": 0, "group_sizes": (1, 2, 3, 4, 5, 6, 7, 8), "width": 12, "discrete": True},
    "sizes_2_to_8_continuous": {"seed": 1, "group_sizes": (2, 8, 3, 7, 4, 6, 5), "width": 16, "discrete": False},
}


def _layout(gen, group_sizes, width):
    """(group index [B] shuffled, non-contiguous ids; response mask [B, T] ragged, gaps, one empty row)."""
    index = torch.cat([torch.full((n,), 10 * g + 3) for g, n in enumerate(group_sizes)])
    index = index[torch.randperm(len(index), generator=gen)]
    batch = len(index)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    lengths[0] = width  # one full-width response
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    for i in range(1, batch, 3):  # masked gaps inside some responses (tool outputs)
        n = int(lengths[i])
        if n >= 5:
            start = int(torch.randint(1, n - 3, (1,), generator=gen))
            mask[i, start:start + 2] = 0.0
    sizes = {int(g): int((index == g).sum()) for g in index.unique()}
    empty = next(i for i in range(batch) if sizes[int(index[i])] >= 4)
    mask[empty] = 0.0  # a response with no valid token
    return index, mask


def _scores(gen, index, discrete):
    if not discrete:
        scores = torch.randn(len(index), generator=gen)
    else:
        scores = torch.tensor([0.0, 0.5, 1.0, -1.0])[torch.randint(0, 4, (len(index),), generator=gen)]
    groups = index.unique()
    scores[index == groups[1]] = 1.0  # all-equal groups
    scores[index == groups[-1]] = 0.0
    return scores


def _log_ratio_outliers(gen, target, mask, value):
    """Put |log r| = value at a few valid positions of `target` (in place)."""
    valid = mask.bool().nonzero()
    pick = valid[torch.randperm(len(valid), generator=gen)[:4]]
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0])
    target[pick[:, 0], pick[:, 1]] += signs * value


def make_case(seed, group_sizes, width, discrete) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    index, mask = _layout(gen, group_sizes, width)
    batch = len(index)
    valid = mask.bool()
    last = torch.where(valid, torch.arange(width).expand(batch, width), -1).max(-1).values.clamp(min=0)
    scores = _scores(gen, index, discrete) * valid.any(-1)
    outcome = torch.zeros(batch, width)
    outcome[torch.arange(batch), last] = scores
    dense = torch.where(valid, 0.1 * torch.randn(batch, width, generator=gen), 0.0) + outcome
    log_prob = -3.0 * torch.rand(batch, width, generator=gen)
    old = log_prob + 0.3 * torch.randn(batch, width, generator=gen)
    ref = log_prob + 0.3 * torch.randn(batch, width, generator=gen)
    _log_ratio_outliers(gen, old, mask, 25.0)
    _log_ratio_outliers(gen, ref, mask, 23.0)
    pi = log_prob.exp()
    pg_adv = torch.where(valid, torch.randn(batch, width, generator=gen), 0.0)
    pg_adv[index == index[0]] = 0.0  # a zero-advantage group
    values = torch.randn(batch, width, generator=gen)
    return {
        "index": index, "response_mask": mask, "min_group": torch.tensor(min(group_sizes)),
        "outcome_rewards": outcome, "token_level_rewards": dense, "values": values,
        "reward_baselines": torch.randn(batch, generator=gen),
        "old_log_probs": log_prob, "sum_pi_squared": pi ** 2 + (1 - pi) ** 2 * torch.rand(batch, width, generator=gen),
        "rollout_is_weights": torch.where(valid, 0.5 + 1.5 * torch.rand(batch, width, generator=gen), 0.0),
        "log_prob": log_prob, "old_log_prob": old, "ref_log_prob": ref,
        "rollout_log_probs": log_prob + 0.2 * torch.randn(batch, width, generator=gen),
        "pg_advantages": pg_adv,
        "loss_mat": torch.randn(batch, width, generator=gen),
        "vpreds": values + 0.4 * torch.randn(batch, width, generator=gen),
        "returns": values + torch.randn(batch, width, generator=gen),
        # a fresh critic: values near 0, where V_old + clamp(V - V_old) rounds V (the vf_clipfrac bug), run in fp32
        "critic_values": 0.1 * values, "critic_vpreds": 0.1 * values + 0.1 * torch.randn(batch, width, generator=gen),
        "critic_returns": 0.1 * values + 0.3 * torch.randn(batch, width, generator=gen),
    }
