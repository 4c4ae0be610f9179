"""Token sampling as small pure functions on [B, V] logits (after gpt-fast `generate.py`).

The order is: mask padded vocab rows -> temperature -> top-k -> top-p -> draw. The log-prob returned with
every token is the one the trainer recomputes:

    logprob(token) = log_softmax(logits / T)[token]    (T = 1 when greedy, i.e. temperature == 0)

over the FULL real vocabulary: it is taken before top-k / top-p truncation, so it is finite for every
token of the real vocab and equals what a training forward with the same temperature gives.

>>> logits = torch.tensor([[2.0, 1.0, 0.0, 5.0]])  # the last id is vocab padding
>>> masked = mask_padded_vocab(logits, vocab_size=3)
>>> tokens, logp = sample(masked, temperature=0.0)
>>> tokens.tolist(), round(logp.item(), 4)  # log(e^2 / (e^2 + e^1 + e^0))
([0], -0.4076)
"""
from __future__ import annotations

from typing import Optional

import torch


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V_padded] -> the same with ids >= vocab_size set to -inf (padded rows are never sampled).

    >>> mask_padded_vocab(torch.zeros(1, 4), 3).tolist()
    [[0.0, 0.0, 0.0, -inf]]
    """
    if logits.size(-1) <= vocab_size:
        return logits
    logits = logits.clone()
    logits[..., vocab_size:] = float("-inf")
    return logits


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T; greedy (T == 0) leaves them unscaled, i.e. T = 1 for its log-probs.

    >>> apply_temperature(torch.tensor([[2.0, 4.0]]), 0.5).tolist()
    [[4.0, 8.0]]
    """
    return logits if temperature in (0.0, 1.0) else logits / temperature


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the k largest logits per row (ties with the k-th value are kept); top_k <= 0 = off.

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), 2).tolist()
    [[-inf, 3.0, 2.0]]
    """
    if top_k <= 0 or top_k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability reaches top_p
    (a token is kept when the mass of the tokens ranked above it is < top_p; the top-1 is always kept).

    >>> probs = torch.tensor([[0.5, 0.3, 0.2]])
    >>> top_p_filter(probs.log(), 0.6).isfinite().tolist()  # 0.5 < 0.6 keeps 0.3; 0.8 >= 0.6 drops 0.2
    [[True, True, False]]
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs  # [B, V] mass of the tokens ranked higher
    drop_sorted = mass_above >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B] fp32: log_softmax(logits / T) at `tokens`, T = 1 when temperature == 0 (the trainer's formula).

    >>> token_logprobs(torch.tensor([[0.0, 0.0]]), torch.tensor([1]), 1.0).tolist()  # log(1/2)
    [-0.6931471824645996]
    """
    scaled = apply_temperature(logits.float(), temperature)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def draw(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One sample per row of [B, V] probabilities without a host sync (exponential race: argmax p / E,
    E ~ Exp(1), picks id i with probability p_i). Zero-probability ids are never drawn."""
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / race, dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, V] logits (padded vocab already masked) -> (tokens [B] long, logprobs [B] fp32).

    temperature == 0 is greedy (argmax; top-k / top-p do not change it and the generator is not used).
    The log-prob is that of the temperature-scaled full distribution, before truncation (module doc).
    """
    logits = logits.float()
    if temperature == 0.0:
        tokens = torch.argmax(logits, dim=-1)
    else:
        filtered = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
        tokens = draw(torch.softmax(filtered, dim=-1), generator)
    return tokens, token_logprobs(logits, tokens, temperature)


def gumbel_argmax(scaled: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Gumbel-max: argmax_i scaled_i - log(-log u_i), u ~ U[0, 1), picks id i with probability
    softmax(scaled)_i. It is `draw`'s exponential race on the log scale (-log u ~ Exp(1)), so it needs no
    probabilities: one pass over the logits. u = 0 loses the race; -inf logits never win a finite row."""
    return torch.argmax(scaled - torch.log(-torch.log(uniform)), dim=-1)


def sample_plain(logits: torch.Tensor, temperature: float,
                 uniform: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` without top-k / top-p, as two reductions over the vocabulary that torch.compile fuses into
    one read of the logits (no softmax, no probability tensor): greedy argmax or Gumbel-max, and
    log-prob = scaled[token] - logsumexp(scaled), i.e. `token_logprobs`. uniform [B, V]: the draws (default:
    fresh ones from the default generator of the logits' device).

    >>> tokens, logp = sample_plain(torch.tensor([[2.0, 1.0, 0.0]]), temperature=0.0)
    >>> tokens.tolist(), round(logp.item(), 4)
    ([0], -0.4076)
    """
    scaled = apply_temperature(logits.float(), temperature)
    if temperature == 0.0:
        tokens = torch.argmax(scaled, dim=-1)
    else:
        tokens = gumbel_argmax(scaled, torch.rand_like(scaled) if uniform is None else uniform)
    logz = torch.logsumexp(scaled, dim=-1)  # [B]
    return tokens, scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logz


def replica_seed(seed: int, dp_rank: int) -> int:
    """The sampling seed of one DP replica: identical on its TP / PP ranks, distinct across replicas.

    >>> replica_seed(0, 0) != replica_seed(0, 1)
    True
    """
    return (seed * 1_000_003 + dp_rank * 7_919 + 12_345) % (2**63 - 1)
