"""Loss aggregation (`actor.loss_agg_mode`) in megatron-core's per-token-loss contract.

`aggregate_loss` returns (loss_sum, count, metrics): two 0-dim tensors whose SUMS over every micro-batch
and DP rank, divided, give the exact global loss of the mode. This is what megatron-core expects of a
`loss_func` when `calculate_per_token_loss=True` (`pipeline_parallel/schedules.py`: it backpropagates
loss_sum, adds up count into an int tensor, and `finalize_model_grads` divides the gradients by the
global count). So 1, 2 or 4 micro-batches give the same loss and gradient. `count` is an int64 tensor
(megatron adds it in place into an int32 tensor, which a float would break).

Modes (for sequences i with valid tokens t; N_i = number of valid tokens, S = sequences with N_i >= 1):
  token-mean               sum_i sum_t l_it / sum_i N_i
  seq-mean-token-mean      1/|S| sum_i (1/N_i) sum_t l_it
  seq-mean-token-sum       1/|S| sum_i sum_t l_it
  seq-mean-token-sum-norm  sum_i sum_t l_it / L           (verl; L = `norm_length`, a constant such as the
                           max response length, never the padded width of a batch)
                           1/|S| sum_i sum_t l_it / L    with `sum_norm_per_seq` (Dr. GRPO, arXiv
                           2503.20783: its objective keeps GRPO's 1/G and drops 1/|o_i|)
  seq-mean-all-rows        1/B sum_i (1/N_i) sum_t l_it   (rows without a valid token count, as 0: verl's
                           geo_mean; not a user choice, see losses.agg_mode_for)
Sequences with no valid token (e.g. dummy padding samples) are not counted, except in seq-mean-all-rows.
verl's `agg_loss` sums seq-mean-token-sum-norm over the sequences of a micro-batch; here its loss_sum is
scaled by `num_rows` (the global rows of the mini-batch) over the rows of the call, with count = those
rows, so the global loss is the mini-batch sum / L at any layout. Equal to verl on a single call.
"""
from __future__ import annotations

import torch
from torch import Tensor

from rlhf_mcore.algorithms.stats import masked_count, masked_sum
from rlhf_mcore.registry import Registry

LOSS_AGG_MODES: Registry = Registry("loss aggregation mode (actor.loss_agg_mode)")


def _num_seqs(mask: Tensor) -> Tensor:
    return (masked_count(mask, -1) > 0).sum()


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss: Tensor, mask: Tensor, **_) -> tuple[Tensor, Tensor]:
    return masked_sum(loss, mask), masked_count(mask)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss: Tensor, mask: Tensor, **_) -> tuple[Tensor, Tensor]:
    per_seq = masked_sum(loss, mask, -1) / masked_count(mask, -1).clamp(min=1).to(loss.dtype)  # [B]
    return per_seq.sum(), _num_seqs(mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss: Tensor, mask: Tensor, **_) -> tuple[Tensor, Tensor]:
    return masked_sum(loss, mask), _num_seqs(mask)


@LOSS_AGG_MODES.register("seq-mean-all-rows", hidden=True)  # internal: geo_mean's mode (agg_mode_for)
def _seq_mean_all_rows(loss: Tensor, mask: Tensor, **_) -> tuple[Tensor, Tensor]:
    per_seq = masked_sum(loss, mask, -1) / masked_count(mask, -1).clamp(min=1).to(loss.dtype)  # [B]
    return per_seq.sum(), torch.tensor(mask.shape[0], dtype=torch.int64, device=mask.device)


def _seq_sum_norm(loss: Tensor, mask: Tensor, norm_length: float | None = None, num_rows: float | None = None,
                  sum_norm_per_seq: bool = False) -> tuple[Tensor, Tensor]:
    if norm_length is None or norm_length <= 0:
        raise ValueError(
            f"actor.loss_agg_mode=seq-mean-token-sum-norm: needs a positive norm_length (got {norm_length}). "
            "Pass the max response length (rollout.max_response_length)."
        )
    if sum_norm_per_seq:
        return masked_sum(loss, mask) / norm_length, _num_seqs(mask)
    rows = mask.shape[0]
    scale = (rows if num_rows is None else num_rows) / norm_length
    return masked_sum(loss, mask) * scale, torch.tensor(rows, dtype=torch.int64, device=mask.device)


LOSS_AGG_MODES.register("seq-mean-token-sum-norm")(_seq_sum_norm)


def aggregate_loss(
    per_token_loss: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    mode: str,
    *,
    norm_length: float | None = None,
    global_count: Tensor | float | None = None,
    num_rows: float | None = None,
    sum_norm_per_seq: bool = False,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Reduce a per-token loss to (loss_sum 0-dim, count 0-dim int64, metrics) for `mode` (LOSS_AGG_MODES).

    Sum loss_sum and count over micro-batches and DP ranks, then divide: that is the global loss.
    With `global_count` (the global count, computed beforehand) loss_sum comes back already divided by it
    (verl-style): then just sum loss_sum over micro-batches and ranks, and do not divide again.
    metrics: "loss" (this call's loss_sum / count, detached), "num_tokens", "num_seqs".
    seq-mean-token-sum-norm only: `num_rows` (rows of the whole mini-batch, default this call's) and
    `sum_norm_per_seq` (divide by the number of sequences too), see the module docstring.
    """
    loss_sum, count = LOSS_AGG_MODES.get(mode)(per_token_loss, mask, norm_length=norm_length, num_rows=num_rows,
                                               sum_norm_per_seq=sum_norm_per_seq)
    metrics = {
        "loss": (loss_sum / count.clamp(min=1)).detach(),
        "num_tokens": masked_count(mask),
        "num_seqs": _num_seqs(mask),
    }
    if global_count is not None:
        loss_sum = loss_sum / torch.as_tensor(global_count, dtype=loss_sum.dtype, device=loss_sum.device)
    return loss_sum, count, metrics
