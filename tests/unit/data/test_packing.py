"""Packing plans and the packed layout (pure tensor code, no model)."""
import random

import pytest
import torch

from rlhf_mcore.config import ActorConfig, Config, DataConfig
from rlhf_mcore.data.packing import pack_rows, padding_stats, plan_bins, plan_dp_split, to_rows, token_budget
from rlhf_mcore.trainer.phases import micro_batching
from rlhf_mcore.trainer.schedule import split_micro_batches


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


def _ragged(lengths: list[int]) -> dict:
    seq = max(lengths)
    lens = torch.tensor(lengths)
    valid = torch.arange(seq).unsqueeze(0) < lens.unsqueeze(1)
    return {"tokens": (torch.arange(seq) + 1).repeat(len(lengths), 1) * valid, "lengths": lens}


def _slots(mbs: list[dict]) -> list[int]:
    """Token slots each micro-batch computes (rows x width; a packed one is one row)."""
    return [mb["tokens"].numel() for mb in mbs]


@pytest.mark.parametrize("multiple", [1, 4])
def test_auto_budget_packs_no_more_tokens_than_the_largest_padded_micro_batch(multiple):
    rng = random.Random(2)
    batch = _ragged([rng.randint(96, 500) for _ in range(64)])
    padded = split_micro_batches(batch, micro_batch_size=8, multiple=multiple)
    packed = split_micro_batches(batch, micro_batch_size=8, multiple=multiple, pack=True)  # max_tokens=0: auto
    longest = -(-max(batch["lengths"].tolist()) // multiple) * multiple
    assert max(_slots(packed)) <= 8 * longest == max(_slots(padded))
    assert sum(_slots(packed)) < sum(_slots(padded)) and len(packed) < len(padded)
    assert sorted(int(i) for mb in packed for i in mb["row_index"]) == list(range(64))


def test_token_budget_rule():
    assert token_budget([300, 512, 90], 8) == 8 * 512
    assert token_budget([300, 510, 90], 8, multiple=4) == 8 * 512
    assert token_budget([300, 512, 90], 8, max_tokens=2048) == 2048  # an explicit budget wins
    with pytest.raises(ValueError, match="micro_batch_size > 0"):
        token_budget([3], 0)


def test_auto_budget_for_dynamic_batch_size():
    batch = _ragged([40, 10, 10, 10, 10, 10, 10, 10, 10])  # padded, 2 rows: the largest micro-batch is 2 x 40
    groups = split_micro_batches(batch, micro_batch_size=2, dynamic=True)
    assert max(_slots(groups)) <= 80 and [mb["tokens"].size(0) for mb in groups] == [2, 7]


def test_micro_batching_passes_the_auto_budget():
    cfg = Config(data=DataConfig(use_sequence_packing=True), actor=ActorConfig(micro_batch_size_per_gpu=3))
    split = micro_batching(cfg, cfg.actor)
    assert split["max_tokens"] == 0 and split["pack"] and split["micro_batch_size"] == 3
    assert max(_slots(split_micro_batches(_ragged([7, 5, 3, 3, 2]), **split))) <= 3 * 7
