"""The metric reduction (`trainer/metrics.py`) on hand values: weighted means by each entry's weight, true
max / min (entries of weight 0 ignored), the exact loss, bare values as weight 1, over micro-batches and
over two gloo ranks."""
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_mcore.trainer.metrics import combine, local_summary, reduce_outputs, weighted

# two micro-batches of rank 0, one of rank 1: (value, weight = valid tokens)
RANK0 = [{"a/pg_loss": (torch.tensor(1.0), torch.tensor(3)), "a/ratio_max": (torch.tensor(1.5), torch.tensor(3)),
          "a/ratio_min": (torch.tensor(0.9), torch.tensor(3)), "a/loss_sum": torch.tensor(3.0),
          "a/loss_count": torch.tensor(3)},
         {"a/pg_loss": (torch.tensor(-2.0), torch.tensor(1)), "a/ratio_max": (torch.tensor(2.5), torch.tensor(1)),
          "a/ratio_min": (torch.tensor(0.7), torch.tensor(1)), "a/loss_sum": torch.tensor(-2.0),
          "a/loss_count": torch.tensor(1)},
         {"a/grad_norm": torch.tensor(4.0)}]
RANK1 = [{"a/pg_loss": (torch.tensor(0.5), torch.tensor(4)), "a/ratio_max": (torch.tensor(1.2), torch.tensor(4)),
          "a/ratio_min": (torch.tensor(0.8), torch.tensor(4)), "a/loss_sum": torch.tensor(2.0),
          "a/loss_count": torch.tensor(4)},
         {"a/pg_loss": (torch.tensor(9.0), torch.tensor(0)),  # no valid token: neither mean nor max may see it
          "a/ratio_max": (torch.tensor(float("-inf")), torch.tensor(0)),
          "a/ratio_min": (torch.tensor(float("inf")), torch.tensor(0)), "a/loss_sum": torch.tensor(0.0),
          "a/loss_count": torch.tensor(0)},
         {"a/grad_norm": torch.tensor(4.0)}]
WANT = {"a/pg_loss": (1.0 * 3 - 2.0 * 1 + 0.5 * 4) / 8,  # 0.375; the mean of the micro-batch means is 2.125
        "a/ratio_max": 2.5, "a/ratio_min": 0.7, "a/loss": (3.0 - 2.0 + 2.0) / 8, "a/grad_norm": 4.0}


def test_weighted_mean_max_min_and_loss_over_micro_batches_and_ranks():
    got = combine([local_summary(RANK0), local_summary(RANK1)])
    assert got == pytest.approx(WANT, abs=1e-7)
    assert combine([local_summary(RANK0 + RANK1)]) == pytest.approx(WANT, abs=1e-7)  # one rank, same numbers


def test_one_rank_partial_sums():
    summary = local_summary(RANK0)
    assert summary["a/pg_loss"] == (1.0, 4.0)  # (sum of value * weight, sum of weights)
    assert summary["a/ratio_max"] == (2.5, 4.0) and summary["a/ratio_min"] == pytest.approx((0.7, 4.0))
    assert summary["a/loss_sum"] == (1.0, 2.0) and summary["a/loss_count"] == (4.0, 2.0)


def test_all_empty_reads_zero_and_weighted_pairs_every_metric():
    empty = [weighted({"a/x": torch.tensor(5.0), "a/x_max": torch.tensor(-float("inf"))}, torch.tensor(0))]
    assert combine([local_summary(empty)]) == {"a/x": 0.0, "a/x_max": 0.0}
    assert weighted({"a": 1, "b": 2}, 7) == {"a": (1, 7), "b": (2, 7)}


def _worker(rank: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    # rank 2 is a pipeline stage without the loss (not last): it reports nothing and must not count
    ctx = SimpleNamespace(is_last_stage=rank < 2, tp_rank=0)
    out[rank] = reduce_outputs([RANK0, RANK1, [{"a/pg_loss": (torch.tensor(99.0), torch.tensor(99))}]][rank], ctx)
    dist.destroy_process_group()


def test_reduce_outputs_over_gloo_ranks(tmp_path):
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(str(tmp_path / "init"), out), nprocs=3)
    for rank in range(3):
        assert out[rank] == pytest.approx(WANT, abs=1e-7)
