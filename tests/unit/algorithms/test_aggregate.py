"""Loss aggregation: hand values and invariance to the micro-batch split (megatron per-token-loss contract)."""
import pytest
import torch

from rlhf_mcore.algorithms import LOSS_AGG_MODES, aggregate_loss

NAN = float("nan")
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, NAN, NAN, NAN], [NAN, NAN, NAN, NAN]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # the third sequence is all padding


@pytest.mark.parametrize("mode, loss_sum, count", [
    ("token-mean", 10.0, 4),  # (1 + 2 + 3 + 4) / 4 tokens
    ("seq-mean-token-mean", 6.0, 2),  # (mean(1, 2, 3) + mean(4)) / 2 sequences
    ("seq-mean-token-sum", 10.0, 2),  # (6 + 4) / 2
    ("seq-mean-token-sum-norm", 6.0, 3),  # verl: (6 + 4) / 5 with norm_length 5, as 3 rows x 2 / 3 rows
    ("seq-mean-all-rows", 6.0, 3),  # (mean(1, 2, 3) + mean(4) + 0) / 3 rows
])
def test_hand_values(mode, loss_sum, count):
    s, c, m = aggregate_loss(LOSS, MASK, mode, norm_length=5)
    assert s.dim() == 0 and c.dim() == 0 and c.dtype == torch.int64
    assert s.item() == pytest.approx(loss_sum) and c.item() == count
    assert m["loss"].item() == pytest.approx(loss_sum / count)
    assert m["num_tokens"].item() == 4 and m["num_seqs"].item() == 2
    s_g, c_g, _ = aggregate_loss(LOSS, MASK, mode, norm_length=5, global_count=torch.tensor(8))
    assert s_g.item() == pytest.approx(loss_sum / 8) and c_g.item() == count


def test_sum_norm_per_seq_divides_by_sequences():
    s, c, _ = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=5, sum_norm_per_seq=True)
    assert s.item() / c.item() == pytest.approx(1.0)  # (6 + 4) / 5 / 2 sequences (Dr. GRPO)


def test_count_adds_into_megatron_int32_accumulator():
    total = torch.zeros([], dtype=torch.int)  # what schedules.py accumulates into
    total += aggregate_loss(LOSS, MASK, "token-mean")[1]
    assert total.item() == 4


def test_sum_norm_needs_norm_length():
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")


def reference_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: float) -> torch.Tensor:
    """The global loss written directly from the definitions, on the whole mini-batch."""
    rows = [(loss[b][mask[b].bool()]) for b in range(loss.shape[0]) if mask[b].any()]
    per_mode = {
        "token-mean": lambda: torch.cat(rows).mean(),
        "seq-mean-token-mean": lambda: torch.stack([r.mean() for r in rows]).mean(),
        "seq-mean-token-sum": lambda: torch.stack([r.sum() for r in rows]).mean(),
        "seq-mean-token-sum-norm": lambda: torch.stack([r.sum() / norm_length for r in rows]).sum(),
        "seq-mean-all-rows": lambda: torch.stack([r.mean() for r in rows]).sum() / loss.shape[0],
    }
    return per_mode[mode]()


def minibatch(seed: int):
    g = torch.Generator().manual_seed(seed)
    batch, width = 8, 7
    lengths = torch.tensor([7, 1, 0, 3, 5, 2, 6, 4])  # one empty sequence
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    return x, y, mask


def per_token_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (w * x) ** 2 + w * y  # [B, T], depends on the parameter w


@pytest.mark.parametrize("mode", LOSS_AGG_MODES.names())
@pytest.mark.parametrize("num_micro", [1, 2, 4])
def test_micro_batch_split_invariance(mode, num_micro):
    x, y, mask = minibatch(0)
    norm_length = 7.0
    w_ref = torch.tensor(0.7, requires_grad=True)
    expected = reference_loss(per_token_loss(w_ref, x, y), mask, mode, norm_length)
    expected.backward()

    # megatron: backprop every micro-batch's loss_sum, sum counts (over DP too), divide the grads once
    w = torch.tensor(0.7, requires_grad=True)
    total_sum, total_count = torch.zeros(()), torch.zeros((), dtype=torch.int)
    for xs, ys, ms in zip(x.chunk(num_micro), y.chunk(num_micro), mask.chunk(num_micro)):
        width = max(int(ms.sum(-1).max()), 1)  # each micro-batch padded only to its own longest response
        loss_sum, count, _ = aggregate_loss(per_token_loss(w, xs[:, :width], ys[:, :width]), ms[:, :width],
                                            mode, norm_length=norm_length, num_rows=x.shape[0])
        loss_sum.backward()
        total_sum, total_count = total_sum + loss_sum.detach(), total_count + count
    torch.testing.assert_close(total_sum / total_count, expected.detach())
    torch.testing.assert_close(w.grad / total_count, w_ref.grad)

    # verl-style: divide by the precomputed global count inside, then just sum
    w2 = torch.tensor(0.7, requires_grad=True)
    global_sum = torch.zeros(())
    for xs, ys, ms in zip(x.chunk(num_micro), y.chunk(num_micro), mask.chunk(num_micro)):
        loss_sum, _, _ = aggregate_loss(per_token_loss(w2, xs, ys), ms, mode, norm_length=norm_length,
                                        global_count=total_count, num_rows=x.shape[0])
        loss_sum.backward()
        global_sum = global_sum + loss_sum.detach()
    torch.testing.assert_close(global_sum, expected.detach())
    torch.testing.assert_close(w2.grad, w_ref.grad)


def test_modes_really_differ():
    """Guard against an invariance test that passes because every mode computes the same thing."""
    x, y, mask = minibatch(0)
    values = [reference_loss(per_token_loss(torch.tensor(0.7), x, y), mask, m, 5.0).item()
              for m in LOSS_AGG_MODES.names()]
    assert len({round(v, 6) for v in values}) == len(values)
