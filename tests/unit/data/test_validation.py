import pytest

from rlhf_mcore.data import ValidationSampler
from rlhf_mcore.data.validation import validation_shard
from rlhf_mcore.trainer.scoring import merge_source_sums, source_sums


def test_hand_computed_shards():
    assert validation_shard(5, 0, 2) == ([0, 1, 2], [True, True, True])
    assert validation_shard(5, 1, 2) == ([3, 4, 0], [True, True, False])
    assert validation_shard(2, 3, 4) == ([1], [False])
    assert validation_shard(4, 1, 2) == ([2, 3], [True, True])


@pytest.mark.parametrize("num_rows, dp", [(1, 1), (7, 3), (8, 4), (3, 8), (10, 4)])
def test_every_row_kept_exactly_once_and_equal_counts(num_rows, dp):
    shards = [validation_shard(num_rows, r, dp) for r in range(dp)]
    assert len({len(idx) for idx, _ in shards}) == 1
    kept = [i for idx, keep in shards for i, k in zip(idx, keep) if k]
    assert kept == list(range(num_rows))


def test_sampler_batches_and_metric_reduction():
    rows = list("abcde")
    val = [ValidationSampler(rows, dp_rank=r, dp_size=2) for r in range(2)]
    assert val[1].shard() == (["d", "e", "a"], [True, True, False])
    assert list(val[1].batches(2)) == [(["d", "e"], [True, True]), (["a"], [False])]
    assert len(list(val[0].batches(2))) == len(list(val[1].batches(2)))
    scores = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 0.0}
    parts = [source_sums(["src"] * len(rows), {"acc": [scores[x] for x in rows]}, keep)
             for rows, keep in (v.shard() for v in val)]  # the per-rank half of validation's reduction
    assert merge_source_sums(parts)["src"]["acc"] == [3.0, 5]  # the padded duplicate of "a" is not counted twice
    with pytest.raises(ValueError, match="validation set is empty"):
        ValidationSampler([])

