import pytest

from rlhf_mcore.data.sampler import PromptSampler, epoch_order, rank_shard

ROWS = list(range(10))


def _take(sampler, steps):
    return [sampler.next_batch() for _ in range(steps)]


def test_unshuffled_order_drop_last():
    s = PromptSampler(ROWS, 4, shuffle=False)
    assert s.steps_per_epoch == 2
    assert _take(s, 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]  # rows 8, 9 are dropped
    assert (s.epoch, s.position) == (1, 1)


def test_unshuffled_order_keep_last_wraps():
    s = PromptSampler(ROWS, 4, shuffle=False, drop_last=False)
    assert s.steps_per_epoch == 3
    assert _take(s, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [0, 1, 2, 3]]
    assert s.epoch == 1


def test_shuffle_is_seeded_per_epoch():
    assert epoch_order(10, 0, 0) == epoch_order(10, 0, 0)
    assert sorted(epoch_order(10, 0, 0)) == ROWS
    assert epoch_order(10, 0, 0) != epoch_order(10, 0, 1)
    assert epoch_order(10, 0, 0) != epoch_order(10, 1, 0)
    s = PromptSampler(ROWS, 5, seed=3)
    first, second = _take(s, 2), _take(s, 2)
    assert sorted(first[0] + first[1]) == ROWS and sorted(second[0] + second[1]) == ROWS
    assert first != second
    assert first == [epoch_order(10, 3, 0)[:5], epoch_order(10, 3, 0)[5:]]


def test_dp_ranks_split_the_global_batch():
    full = _take(PromptSampler(ROWS, 6, seed=1, drop_last=False), 5)
    ranks = [_take(PromptSampler(ROWS, 6, seed=1, drop_last=False, dp_rank=r, dp_size=3), 5) for r in range(3)]
    for step in range(5):
        assert all(len(ranks[r][step]) == 2 for r in range(3))
        assert ranks[0][step] + ranks[1][step] + ranks[2][step] == full[step]


@pytest.mark.parametrize("stop_at", [1, 2, 3, 7])
def test_resume_continues_exactly(stop_at):
    reference = _take(PromptSampler(ROWS, 4, seed=5), 10)
    first = PromptSampler(ROWS, 4, seed=5)
    _take(first, stop_at)
    resumed = PromptSampler(ROWS, 4, seed=5)
    resumed.load_state_dict(first.state_dict())
    assert _take(resumed, 10 - stop_at) == reference[stop_at:]


def test_resume_under_another_dp_size_keeps_the_global_order():
    reference = _take(PromptSampler(ROWS, 4, seed=2), 4)
    first = PromptSampler(ROWS, 4, seed=2)
    _take(first, 1)
    ranks = [PromptSampler(ROWS, 4, seed=2, dp_rank=r, dp_size=2) for r in range(2)]
    for s in ranks:
        s.load_state_dict(first.state_dict())
    assert [ranks[0].next_batch() + ranks[1].next_batch() for _ in range(3)] == reference[1:]


def test_state_dict_contents_and_mismatch():
    s = PromptSampler(ROWS, 4, seed=9)
    _take(s, 3)
    state = s.state_dict()
    assert {k: state[k] for k in ("epoch", "position", "seed", "num_rows")} == {
        "epoch": 1, "position": 1, "seed": 9, "num_rows": 10
    }
    with pytest.raises(ValueError, match="seed was 9 when saved but is 8 now"):
        PromptSampler(ROWS, 4, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="num_rows was 10 when saved but is 9 now"):
        PromptSampler(ROWS[:9], 4, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="position/epoch out of range"):
        PromptSampler(ROWS, 4, seed=9).load_state_dict({**state, "position": 2})


def test_layout_errors():
    with pytest.raises(ValueError, match="must be divisible by the data-parallel size 4 .got 6."):
        PromptSampler(ROWS, 6, dp_size=4)
    with pytest.raises(ValueError, match="larger than the dataset .12 > 10 prompts."):
        PromptSampler(ROWS, 12)
    assert PromptSampler(ROWS, 12, drop_last=False, shuffle=False).next_batch() == ROWS + [0, 1]
    with pytest.raises(ValueError, match="dp_rank < dp_size"):
        PromptSampler(ROWS, 4, dp_rank=2, dp_size=2)


@pytest.mark.parametrize("dp", [2, 4])
def test_every_mini_batch_holds_the_same_prompts_at_any_dp_size(dp):
    """Three steps of 8 prompts in mini-batches of 4: rank r's k-th mini-batch (its k-th run of 4 / dp prompts) over
    all ranks is the 1-rank run's k-th mini-batch, so an optimizer step trains the same prompts at DP1 and DP2/4
    (before, DP2's first optimizer step trained prompts 0, 1 and 4, 5)."""
    one = PromptSampler(ROWS, 8, seed=3, mini_batch_size=4)
    ranks = [PromptSampler(ROWS, 8, seed=3, dp_rank=r, dp_size=dp, mini_batch_size=4) for r in range(dp)]
    part = 4 // dp
    for _ in range(3):
        whole, shares = one.next_batch(), [s.next_batch() for s in ranks]
        for k in range(2):
            mine = [x for share in shares for x in share[k * part:(k + 1) * part]]
            assert sorted(mine) == sorted(whole[k * 4:k * 4 + 4])
        assert [x for s in shares for x in s[:part]] == whole[:4]  # rank order within the mini-batch too


def test_a_mini_batch_that_does_not_split_over_the_ranks_keeps_contiguous_shards():
    assert rank_shard(list(range(8)), 1, 4, chunk=2) == [2, 3]  # 2 prompts cannot go to 4 ranks: contiguous
