"""Sampling functions against hand computations, plus the doctests of the rollout helpers."""
from __future__ import annotations

import doctest
import math

import pytest
import torch

from rlhf_mcore.rollout import comm, kv_cache, responses, sampling, stopping
from rlhf_mcore.rollout.sampling import (
    apply_temperature,
    mask_padded_vocab,
    sample,
    token_logprobs,
    top_k_filter,
    top_p_filter,
)

INF = float("inf")


@pytest.mark.parametrize("module", [sampling, stopping, kv_cache, responses, comm])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


def test_mask_padded_vocab_leaves_the_input_alone():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert mask_padded_vocab(logits, 2).tolist() == [[1.0, 2.0, -INF, -INF]]
    assert logits.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert mask_padded_vocab(logits, 4) is logits


def test_temperature_and_logprob_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert apply_temperature(logits, 2.0).tolist() == [[0.5, 1.0, 1.5]]
    want = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))  # log_softmax(logits / 2)[2]
    assert token_logprobs(logits, torch.tensor([2]), 2.0).item() == pytest.approx(want, abs=1e-6)
    want_t1 = 1.0 - math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0))
    assert token_logprobs(logits, torch.tensor([0]), 0.0).item() == pytest.approx(want_t1, abs=1e-6)


def test_greedy_is_argmax_with_unscaled_logprob():
    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 0.0, -1.0]])
    tokens, logp = sample(logits, temperature=0.0, top_k=1, top_p=0.1)
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_top_k_keeps_ties():
    assert top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 3.0]]), 2).tolist() == [[-INF, 3.0, -INF, 3.0]]
    assert top_k_filter(torch.tensor([[1.0, 3.0]]), -1).tolist() == [[1.0, 3.0]]


def test_top_p_by_hand():
    logits = torch.tensor([[0.1, 0.6, 0.3]]).log()
    # sorted 0.6, 0.3, 0.1: mass above = 0, 0.6, 0.9 -> p=0.7 keeps 0.6 and 0.3
    assert top_p_filter(logits, 0.7).isfinite().tolist() == [[False, True, True]]
    assert top_p_filter(logits, 0.5).isfinite().tolist() == [[False, True, False]]
    assert top_p_filter(logits, 0.95).isfinite().tolist() == [[True, True, True]]
    assert top_p_filter(logits, 0.01).isfinite().tolist() == [[False, True, False]]  # top-1 always kept


def test_logprob_is_before_truncation():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    tokens, logp = sample(logits, temperature=0.5, top_k=1, generator=torch.Generator().manual_seed(0))
    assert tokens.tolist() == [2]
    assert logp.item() == pytest.approx(torch.log_softmax(logits / 0.5, -1)[0, 2].item(), abs=1e-6)
    assert logp.item() < -0.1  # not log(1) of the truncated distribution


def test_sampled_frequencies_follow_the_filtered_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    logits = probs.log().expand(40_000, 4)
    gen = torch.Generator().manual_seed(1)
    tokens, _ = sample(logits, temperature=1.0, generator=gen)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    tokens, _ = sample(logits, temperature=1.0, top_p=0.7, generator=gen)  # keeps 0.5 and 0.25
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=0.01, rtol=0)
    tokens, _ = sample(logits, temperature=2.0, top_k=2, generator=gen)  # p^(1/2) renormalised on 2 ids
    hot = probs[:2].sqrt() / probs[:2].sqrt().sum()
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, torch.cat([hot, torch.zeros(2)]), atol=0.01, rtol=0)


def test_seeded_draws_are_reproducible():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    a, _ = sample(logits, 1.0, generator=torch.Generator().manual_seed(7))
    b, _ = sample(logits, 1.0, generator=torch.Generator().manual_seed(7))
    c, _ = sample(logits, 1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stop_strings_need_decode_and_see_the_tail_only():
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # 1 -> 'a'
    with pytest.raises(ValueError, match="decode"):
        stopping.stop_string_hits([[1]], ("a",), None)
    assert stopping.stop_string_hits([[1]], (), None) == [False]
    long = [5] * 100 + [1, 2]  # "...eeeab": the match is completed by the last token
    assert stopping.ends_with_stop_string(long, ("ab",), decode)
    assert not stopping.ends_with_stop_string(long + [3], ("ab",), decode)  # already matched earlier
    assert stopping.is_stop_token(torch.tensor([1, 2]), ()).tolist() == [False, False]


def test_compact_moves_running_rows_to_the_front():
    key = torch.arange(4 * 3, dtype=torch.float32).view(4, 3, 1, 1)  # [slots, rows, groups, dim]
    value = -key.clone()
    fake = type("Ctx", (), {})()
    fake.sequence_len_offset, fake.key_value_memory_dict = 2, {1: (key, value)}
    kv_cache.compact(fake, torch.tensor([2, 0]))
    assert key[:2, :2, 0, 0].tolist() == [[2.0, 0.0], [5.0, 3.0]]
    assert value[:2, :2, 0, 0].tolist() == [[-2.0, 0.0], [-5.0, -3.0]]
    assert key[2:, :, 0, 0].tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]  # later slots untouched


def test_response_buffer_bookkeeping():
    buf = responses.ResponseBuffer.empty(3, 4, pad_id=0, device="cpu")
    rows = torch.tensor([0, 1, 2])
    buf.record(rows, 0, torch.tensor([5, 6, 7]), torch.tensor([-1.0, -2.0, -3.0]))
    buf.finish(torch.tensor([1]), 0, stopped=True)
    buf.record(torch.tensor([0, 2]), 1, torch.tensor([8, 9]), torch.tensor([-4.0, -5.0]))
    assert buf.tails(torch.tensor([0, 2]), 2, torch.tensor([1, 2]), window=2) == [[8, 1], [9, 2]]
    buf.finish(torch.tensor([0, 2]), 1, stopped=False)
    out = buf.to_responses()
    assert [r.tokens for r in out] == [[5, 8], [6], [7, 9]]
    assert [r.finish_reason for r in out] == ["length", "stop", "length"]
    assert out[2].logprobs == [-3.0, -5.0]
