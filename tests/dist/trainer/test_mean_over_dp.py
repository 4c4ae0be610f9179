"""The adaptive KL controller's input is the global-batch mean KL, the same on every DP rank
(`phases.mean_over_dp`): two gloo ranks with different per-rank means and row counts."""
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_mcore.trainer.phases import mean_over_dp

ROWS, MEANS = (4, 2), (0.5, 2.0)  # per rank: rows and the mean KL over them


def _worker(rank: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ctx = SimpleNamespace(dims=SimpleNamespace(dp=2), pgs=SimpleNamespace(dp=None))
    out[rank] = float(mean_over_dp(torch.tensor(MEANS[rank]), ROWS[rank], ctx))
    dist.destroy_process_group()


def test_every_rank_gets_the_global_mean(tmp_path):
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(str(tmp_path / "init"), out), nprocs=2)
    want = (0.5 * 4 + 2.0 * 2) / 6  # 1.0: the mean over all 6 rows, not the mean of the two means (1.25)
    assert out[0] == out[1] and abs(out[0] - want) < 1e-7


def test_one_rank_is_a_no_op():
    ctx = SimpleNamespace(dims=SimpleNamespace(dp=1))
    mean = torch.tensor(0.3)
    assert mean_over_dp(mean, 5, ctx) is mean
