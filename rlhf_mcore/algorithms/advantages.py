"""Advantage estimators, registered by the name users type in `algorithm.adv_estimator`.

Every estimator has the same signature: `fn(AdvantageInputs) -> (advantages [B, T], returns [B, T])`.
Both outputs are 0 at padded positions and carry no gradient. Sign convention: a larger advantage
means "make this token more likely"; the policy losses minimise `-advantage * ratio`.

Outcome estimators (grpo, rloo, ...) score a response with `token_level_rewards.sum(-1)` over valid
tokens and broadcast one advantage to all of its valid tokens. A group is a set of responses to the
same prompt (`group_index`, any long ids, groups of any size). A singleton group has no baseline to
compare against: its baseline is 0 and its std is 1, so its advantage is its raw score.

Masks are "skip" masks for GAE: tokens with mask 0 in the middle of a response (e.g. tool outputs) are
passed through, as if they were absent. reinforce_plus_plus follows verl and restarts its return at
each mask-0 token unless `returns_through_masked` (see rlhf_mcore/algorithms/README.md).
Defaults reproduce verl's `core_algos.py` (tests/unit/algorithms/test_verl_parity.py) on valid tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import group_inverse, group_mean_std, group_sum, masked_whiten
from rlhf_mcore.algorithms.stats import sequence_scores as _scores
from rlhf_mcore.registry import Registry


@dataclass(frozen=True, slots=True)
class AdvantageNeeds:
    """What an estimator needs besides rewards and the mask, declared where it registers
    (`@ADVANTAGES.register(name, groups=True)`); roles, validation and the trainer ask `estimator_needs`."""

    critic: bool = False  # critic values: a critic is built and trained
    groups: bool = False  # compares the samples of one prompt: rollout.n >= 2
    greedy_baseline: bool = False  # the reward of one greedy rollout per prompt, generated each step
    sum_pi_squared: bool = False  # the old policy's log-probs and sum_v pi(v)^2 (an old-log-prob pass)


ADVANTAGES: Registry = Registry("advantage estimator (algorithm.adv_estimator)", traits=AdvantageNeeds)


def estimator_needs(name: str) -> AdvantageNeeds:
    """What estimator `name` declared at registration (raises, listing the names, when unknown)."""
    return ADVANTAGES.traits(name)


@dataclass(kw_only=True, slots=True)
class AdvantageInputs:
    """Everything any estimator may read. Fields an estimator does not use are ignored."""

    token_level_rewards: Tensor  # [B, T] reward per response token (outcome reward on the last one)
    response_mask: Tensor  # [B, T] 1 on response tokens that are trained on
    values: Tensor | None = None  # [B, T] critic values V(s_t) (gae)
    group_index: Tensor | None = None  # [B] long prompt id shared by a group (grpo, rloo, ...)
    baseline_rewards: Tensor | None = None  # [B] score of the greedy rollout (remax)
    old_logp: Tensor | None = None  # [B, T] log pi_old(y_t) (optimal_token_baseline)
    sum_pi_squared: Tensor | None = None  # [B, T] sum_v pi_old(v | s_t)^2 (optimal_token_baseline)
    is_weights: Tensor | None = None  # [B, T] rollout IS weights, scale the OTB path variance (optional)
    gamma: float = 1.0  # discount (gae, reinforce_plus_plus)
    lam: float = 1.0  # GAE lambda
    norm_adv_by_std: bool = True  # grpo / grpo_passk: divide by group std; False gives Dr.GRPO
    whiten_gae: bool = True  # gae: whiten advantages over valid tokens (standard PPO practice)
    epsilon: float = 1e-6  # added to the group std in a denominator (grpo, grpo_passk)
    returns_through_masked: bool = False  # reinforce_plus_plus: False resets G at mask-0 tokens (verl)
    gpg_paper_alpha: bool = False  # gpg: alpha = B / (B - M) of the paper; False: B / #nonzero scores (verl)

    def __post_init__(self):
        shape = self.token_level_rewards.shape
        if self.token_level_rewards.dim() != 2 or self.response_mask.shape != shape:
            raise ValueError(
                f"AdvantageInputs: token_level_rewards and response_mask must both be [B, T] "
                f"(got {tuple(shape)} and {tuple(self.response_mask.shape)}). Pad responses to one length."
            )
        if self.values is not None and self.values.shape != shape:
            got = tuple(self.values.shape)
            raise ValueError(f"AdvantageInputs.values: expected shape {tuple(shape)} (got {got}).")
        for name in ("old_logp", "sum_pi_squared", "is_weights"):
            t = getattr(self, name)
            if t is not None and t.shape != shape:
                raise ValueError(f"AdvantageInputs.{name}: expected shape {tuple(shape)} (got {tuple(t.shape)}).")
        for name in ("group_index", "baseline_rewards"):
            t = getattr(self, name)
            if t is not None and t.shape != shape[:1]:
                got = tuple(t.shape)
                raise ValueError(f"AdvantageInputs.{name}: expected shape ({shape[0]},) (got {got}).")

    def require(self, field: str, estimator: str) -> Tensor:
        value = getattr(self, field)
        if value is None:
            raise ValueError(
                f"algorithm.adv_estimator={estimator}: needs AdvantageInputs.{field} (got None). "
                "Pass it, or choose an estimator that does not need it."
            )
        return value


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    """[B] -> [B, T], 0 at padding."""
    zero = torch.zeros((), dtype=per_seq.dtype, device=per_seq.device)
    return torch.where(mask.bool(), per_seq[:, None], zero)


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} over valid tokens (masked ones skipped), 0 at padding. [B, T] -> [B, T]."""
    valid = mask.bool()
    if gamma == 1.0:  # a reverse cumulative sum is the same recursion
        kept = torch.where(valid, rewards, torch.zeros_like(rewards))
        return torch.where(valid, kept.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(rewards))
    running = torch.zeros_like(rewards[:, 0])  # [B]
    out = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        out.append(running)
    return torch.where(valid, torch.stack(out[::-1], dim=1), torch.zeros_like(rewards))


def restarting_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """verl's REINFORCE++ returns: G_t = r_t + gamma * G_{t+1}, with G reset to 0 after each mask-0 token.
    0 at mask-0 positions. [B, T] -> [B, T]."""
    valid = mask.bool()
    running = torch.zeros_like(rewards[:, 0])  # [B]
    out = []
    for t in reversed(range(rewards.shape[1])):
        current = rewards[:, t] + gamma * running
        out.append(current)
        running = torch.where(valid[:, t], current, torch.zeros_like(current))
    return torch.where(valid, torch.stack(out[::-1], dim=1), torch.zeros_like(rewards))


def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """Raw GAE over valid tokens: A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t,
    with V_{t+1} the value of the next valid token (0 after the last one). [B, T] -> [B, T]."""
    valid = mask.bool()
    next_value = torch.zeros_like(values[:, 0])  # [B]
    running = torch.zeros_like(values[:, 0])  # [B]
    out = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        out.append(running)
    return torch.where(valid, torch.stack(out[::-1], dim=1), torch.zeros_like(rewards))


@ADVANTAGES.register("gae", critic=True)
@torch.no_grad()
def compute_gae(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda), Schulman et al. 2016 (arXiv 1506.02438) Eq. 16; PPO (arXiv 1707.06347) Eq. 11-12.

    returns = raw advantages + values (the critic's regression target); advantages are then whitened over
    valid tokens when `whiten_gae`. Needs `values`.
    """
    values = inp.require("values", "gae").detach()
    mask = inp.response_mask
    adv = gae_advantages(inp.token_level_rewards, values, mask, inp.gamma, inp.lam)
    returns = torch.where(mask.bool(), adv + values, torch.zeros_like(adv))
    if inp.whiten_gae:
        adv = masked_whiten(adv, mask)
    return adv, returns


@ADVANTAGES.register("grpo", groups=True)
@torch.no_grad()
def compute_grpo(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GRPO outcome supervision, DeepSeekMath (arXiv 2402.03300) Sec. 4.1.2: A_i = (r_i - mean(r)) / std(r).

    With `norm_adv_by_std=False` this is Dr. GRPO (arXiv 2503.20783, Sec. 3.2): A_i = r_i - mean(r).
    Std is the unbiased group std. Needs `group_index`.
    """
    scores = _scores(inp.token_level_rewards, inp.response_mask)  # [B]
    mean, std, size = group_mean_std(scores, inp.require("group_index", "grpo"))
    single = size == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    adv = scores - mean
    if inp.norm_adv_by_std:
        adv = adv / (torch.where(single, torch.ones_like(std), std) + inp.epsilon)
    adv = _broadcast(adv, inp.response_mask)
    return adv, adv


@ADVANTAGES.register("rloo", groups=True)
@torch.no_grad()
def compute_rloo(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """RLOO, Ahmadian et al. 2024 (arXiv 2402.14740), the leave-one-out estimator of Kool et al. 2019:
    A_i = r_i - 1/(k-1) sum_{j != i} r_j.

    Equivalently k/(k-1) * (r_i - mean(r)). Needs `group_index`.
    """
    scores = _scores(inp.token_level_rewards, inp.response_mask)  # [B]
    mean, _, size = group_mean_std(scores, inp.require("group_index", "rloo"))
    k = size.to(scores.dtype)
    loo_baseline = (mean * k - scores) / (k - 1.0).clamp(min=1.0)
    adv = scores - torch.where(size == 1, torch.zeros_like(loo_baseline), loo_baseline)
    adv = _broadcast(adv, inp.response_mask)
    return adv, adv


@ADVANTAGES.register("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++, Hu 2025 (arXiv 2501.03262): token returns G_t = sum_{s>=t} gamma^{s-t} r_s, where
    r_s already holds the token-level KL-shaped reward r_s = 1[s = end] r(x, y) - beta KL_s (see
    `kl.apply_kl_penalty`), then A = (G - mean(G)) / sqrt(var(G) + 1e-8) over all valid tokens of the batch
    (global advantage normalisation). returns = G (unwhitened).

    Default (verl): the running return restarts at every mask-0 token, so a reward after a tool output
    does not reach the tokens before it. `returns_through_masked=True` passes it through (the paper's sum
    over the response's own tokens). Pass the whole rollout batch, not a DP shard.
    """
    returns_fn = discounted_returns if inp.returns_through_masked else restarting_returns
    returns = returns_fn(inp.token_level_rewards, inp.response_mask, inp.gamma)
    return masked_whiten(returns, inp.response_mask), returns


@ADVANTAGES.register("reinforce_plus_plus_baseline", groups=True)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline, Hu 2025 (arXiv 2501.03262): A_i = r_i - mean_group(r), broadcast to tokens, then
    A = (A - mean(A)) / sqrt(var(A) + 1e-8) over all valid tokens of the batch. Needs `group_index`.
    """
    scores = _scores(inp.token_level_rewards, inp.response_mask)  # [B]
    mean, _, size = group_mean_std(scores, inp.require("group_index", "reinforce_plus_plus_baseline"))
    adv = _broadcast(scores - torch.where(size == 1, torch.zeros_like(mean), mean), inp.response_mask)
    adv = masked_whiten(adv, inp.response_mask)
    return adv, adv


@ADVANTAGES.register("remax", greedy_baseline=True)
@torch.no_grad()
def compute_remax(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """ReMax, Li et al. 2023 (arXiv 2310.10505), the ReMax gradient estimator with the greedy baseline:
    A_t = G_t - r(x, y_greedy), G_t the undiscounted return-to-go. returns = G.
    Needs `baseline_rewards` (the greedy rollout's score).
    """
    baseline = inp.require("baseline_rewards", "remax").to(inp.token_level_rewards.dtype)
    returns = discounted_returns(inp.token_level_rewards, inp.response_mask, 1.0)
    return returns - _broadcast(baseline, inp.response_mask), returns


@ADVANTAGES.register("gpg", groups=True)
@torch.no_grad()
def compute_gpg(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GPG, Chu et al. 2025 (arXiv 2504.02546), the corrected advantage:
    A_i = alpha * (r_i - mean_group(r)) / F_norm with F_norm = 1.

    Default (verl): alpha = B / #{i : r_i != 0}. `gpg_paper_alpha=True`: the paper's alpha = B / (B - M),
    M = the number of samples in groups whose rewards are all equal (they carry no gradient), so the batch
    gradient is not diluted by them. Needs `group_index`.
    """
    scores = _scores(inp.token_level_rewards, inp.response_mask)  # [B]
    mean, std, size = group_mean_std(scores, inp.require("group_index", "gpg"))
    mean = torch.where(size == 1, torch.zeros_like(mean), mean)
    counted = ((std > 0) | (size == 1)) if inp.gpg_paper_alpha else scores != 0
    alpha = scores.shape[0] / counted.sum().clamp(min=1).to(scores.dtype)
    adv = _broadcast(alpha * (scores - mean), inp.response_mask)
    return adv, adv


@ADVANTAGES.register("opo", groups=True)
@torch.no_grad()
def compute_opo(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """OPO, Hao et al. 2025 (arXiv 2505.23585), the optimal baseline b = sum_i l_i r_i / sum_i l_i over the
    group (l_i = response length in valid tokens); A_i = r_i - b. Needs `group_index`.
    """
    mask = inp.response_mask
    scores = _scores(inp.token_level_rewards, mask)  # [B]
    lengths = mask.bool().sum(-1).to(scores.dtype)  # [B]
    inverse, counts = group_inverse(inp.require("group_index", "opo"))
    num_groups = counts.shape[0]
    total_length = group_sum(lengths, inverse, num_groups).clamp(min=1)  # [G]
    weighted = group_sum(lengths * scores, inverse, num_groups) / total_length  # [G]
    baseline = torch.where(counts[inverse] == 1, torch.zeros_like(scores), weighted[inverse])
    adv = _broadcast(scores - baseline, mask)
    return adv, adv


@ADVANTAGES.register("grpo_passk", groups=True)
@torch.no_grad()
def compute_grpo_passk(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Pass@k GRPO, Tang et al. 2025 (arXiv 2503.19595), leave-one-out pass@k (max-reward) estimator: only the
    best response of a group (first on ties) gets A = r_max - r_second_max, the others 0; divided by the
    group std (+ epsilon) when `norm_adv_by_std`. A singleton group gets 0. Needs `group_index`.
    """
    scores = _scores(inp.token_level_rewards, inp.response_mask)  # [B]
    group_index = inp.require("group_index", "grpo_passk")
    inverse, counts = group_inverse(group_index)
    num_groups, batch = counts.shape[0], scores.shape[0]
    neg_inf = torch.full((num_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    best = neg_inf.scatter_reduce(0, inverse, scores, "amax")  # [G]
    positions = torch.arange(batch, device=scores.device)
    is_max = scores == best[inverse]
    first = torch.full((num_groups,), batch, device=scores.device).scatter_reduce(
        0, inverse, torch.where(is_max, positions, batch), "amin")  # [G] index of the first best
    is_best = positions == first[inverse]  # [B]
    others = torch.where(is_best, torch.full_like(scores, float("-inf")), scores)
    second = neg_inf.scatter_reduce(0, inverse, others, "amax")  # [G], -inf for singletons
    gap = torch.where(counts[inverse] > 1, best[inverse] - second[inverse], torch.zeros_like(scores))
    if inp.norm_adv_by_std:
        gap = gap / (group_mean_std(scores, group_index)[1] + inp.epsilon)
    adv = _broadcast(torch.where(is_best, gap, torch.zeros_like(gap)), inp.response_mask)
    return adv, adv
