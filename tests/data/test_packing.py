"""Packing plans and the packed layout (pure tensor code, no model)."""
import random

import torch

from rlhf_mcore.data.packing import pack_rows, padding_stats, plan_bins, plan_dp_split, to_rows


def test_bins_respect_budget_cover_rows_and_balance():
    rng = random.Random(0)
    lengths = [rng.randint(96, 512) for _ in range(64)]
    bins = plan_bins(lengths, 4096)
    assert sorted(i for b in bins for i in b) == list(range(64))
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert max(loads) <= 4096
    assert len(bins) == -(-sum(lengths) // 4096)  # the fewest possible here
    assert max(loads) - min(loads) <= max(lengths)


def test_dp_split_equal_rows_balanced_tokens():
    rng = random.Random(1)
    lengths = [rng.randint(10, 300) for _ in range(32)]
    parts = plan_dp_split(lengths, 4)
    assert [len(p) for p in parts] == [8] * 4 and sorted(sum(parts, [])) == list(range(32))
    loads = [sum(lengths[i] for i in p) for p in parts]
    naive = [sum(lengths[r * 8:(r + 1) * 8]) for r in range(4)]
    assert max(loads) - min(loads) <= max(max(naive) - min(naive), max(lengths) - min(lengths))


def test_pack_then_unpack_round_trips_the_rows():
    tokens = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    batch = {"tokens": tokens, "lengths": torch.tensor([3, 2, 4]), "mask": (tokens > 0).float(),
             "group": torch.tensor([10, 11, 12])}
    mb = pack_rows(batch, [0, 2], batch["lengths"].tolist(), multiple=4)
    assert mb["tokens"].tolist() == [[5, 6, 7, 1, 2, 3, 4, 0]]  # 7 tokens + 1 to reach a multiple of 4
    assert mb["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert mb["cu_seqlens"].tolist() == [0, 3, 7, 8] and mb["max_seqlen"] == 4
    assert mb["group"].tolist() == [10, 12] and mb["mask"].shape == (2, 4) and mb["row_index"].tolist() == [0, 2]
    x = mb["tokens"].float()
    assert to_rows(x, mb, keep_first=True).tolist() == [[5, 6, 7, 0], [1, 2, 3, 4]]
    assert to_rows(x, mb).tolist() == [[0, 6, 7, 0], [0, 2, 3, 4]]  # nothing predicts a first token
    assert to_rows(x, mb, shift=True).tolist() == [[0, 5, 6, 7], [0, 1, 2, 3]]  # the state before token t


def test_unpack_is_differentiable():
    batch = {"tokens": torch.tensor([[1, 2, 0], [3, 4, 5]]), "lengths": torch.tensor([2, 3])}
    mb = pack_rows(batch, [0, 1], [2, 3])
    x = torch.arange(5.0).unsqueeze(0).requires_grad_()
    to_rows(x, mb).sum().backward()
    assert x.grad.tolist() == [[0, 1, 0, 1, 1]]


def test_padding_fraction_of_a_plan():
    lengths = [10, 2, 2, 2]
    padded = padding_stats(lengths, [[0, 1], [2, 3]])
    assert padded["computed_tokens"] == 24 and abs(padded["padding_fraction"] - 1 / 3) < 1e-12
    assert padding_stats(lengths, plan_bins(lengths, 16), packed=True)["padding_fraction"] == 0.0
