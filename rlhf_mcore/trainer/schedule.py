"""Micro-batching and megatron's forward-backward schedule (PP-aware), shared by every role and phase.

A batch is a dict of tensors whose first dim is the sample and whose per-token fields are aligned with
`tokens` [B, S]. `split_micro_batches` cuts it into fixed-size or token-budget micro-batches, each trimmed
to its own longest sequence, or into packed micro-batches (rlhf_mcore.data.packing: no padding). Each
micro-batch carries `row_index`, its rows in the batch. `run_schedule` feeds them through
`get_forward_backward_func()`; `loss_fn` runs on the last pipeline stage only.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from megatron.core.utils import get_attr_wrapped_model

from rlhf_mcore.data.packing import ROW_FIELDS, is_packed, split_packed, token_budget
from rlhf_mcore.models.packed import packed_seq_params
from rlhf_mcore.models.vision import vision_side
from rlhf_mcore.trainer.ep_lockstep import PaddingBatch, pad_to_group, padding_loss

Batch = dict[str, torch.Tensor]


def take(batch: Batch, index: torch.Tensor | slice) -> Batch:
    return {k: v[index] for k, v in batch.items()}


def trim(batch: Batch, multiple: int = 1) -> Batch:
    """Cut per-token fields to the longest sequence in this micro-batch (`lengths` [b]), rounded up to a
    multiple (sequence parallelism splits the sequence over TP ranks); zero-padded if that is wider."""
    s = -(-int(batch["lengths"].max()) // multiple) * multiple
    out = {}
    for k, v in batch.items():
        if v.dim() >= 2 and k not in ROW_FIELDS:
            widen = (0, 0) * (v.dim() - 2) + (0, s - v.size(1))  # pads dim 1 (e.g. routed_experts [b, s, L, k])
            v = v[:, :s] if v.size(1) >= s else torch.nn.functional.pad(v, widen)
        out[k] = v
    return out


def split_micro_batches(batch: Batch, micro_batch_size: int = 0, max_tokens: int = 0, multiple: int = 1,
                        pack: bool = False, dynamic: bool = False) -> list[Batch]:
    """Fixed size (`micro_batch_size`), grouped to a token budget (`dynamic` or `max_tokens` > 0, first-fit:
    sequences are taken in order and a micro-batch closes when (rows * longest) would pass the budget), or,
    with `pack`, packed without padding into balanced micro-batches of at most the budget's tokens. With
    `pack` or `dynamic` and max_tokens=0 the budget is automatic (`packing.token_budget`: micro_batch_size
    rows of this batch's longest row, the largest padded micro-batch)."""
    num = batch["tokens"].size(0)
    lengths = batch["lengths"].tolist() if pack or dynamic else None
    if lengths is not None:
        max_tokens = token_budget(lengths, micro_batch_size, max_tokens, multiple)
    if pack:
        return split_packed(batch, max_tokens, multiple, lengths)
    batch = {**batch, "row_index": torch.arange(num, device=batch["tokens"].device)}
    if not max_tokens:
        return [trim(take(batch, slice(i, i + micro_batch_size)), multiple) for i in range(0, num, micro_batch_size)]
    groups, current, longest = [], [], 0
    for i, length in enumerate(lengths if lengths is not None else batch["lengths"].tolist()):
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    groups.append(current)
    return [trim(take(batch, torch.tensor(g)), multiple) for g in groups]


def _forward_step(loss_fn: Callable, hooks, data_iterator, model):
    mb = next(data_iterator)
    tokens = mb["tokens"]
    if isinstance(mb, PaddingBatch):  # EP lockstep (trainer/ep_lockstep.py): no hooks, zero loss
        hooks, loss_fn = None, partial(padding_loss, loss_fn)
    if hooks is not None:
        hooks.before(model, mb)
    side = vision_side(model)
    if side is not None:  # a vision LM: images into the embeddings, M-RoPE positions (models.vision_step)
        output = _vision_forward(model, side, mb)
    elif is_packed(mb):
        params = packed_seq_params(mb, get_attr_wrapped_model(model, "packed_qkv_format"))
        output = model(tokens, mb["position_ids"], None, packed_seq_params=params)
    else:
        position_ids = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0).expand_as(tokens)
        output = model(tokens, position_ids, None)
    if hooks is not None:
        hooks.after(model, mb)
    return output, partial(loss_fn, mb)


def _vision_forward(model, side, mb: Batch):
    from rlhf_mcore.models.full_weights import unwrap_model
    from rlhf_mcore.models.vision_step import packed_without_positions, vision_inputs

    packed = is_packed(mb)
    positions, embeddings = vision_inputs(unwrap_model(model), side, mb, packed)  # embeddings: first stage only
    if not packed:
        return model(mb["tokens"], positions, None, decoder_input=embeddings)
    params = packed_without_positions(packed_seq_params(mb, get_attr_wrapped_model(model, "packed_qkv_format")))
    return model(mb["tokens"], positions, None, decoder_input=embeddings, packed_seq_params=params)


def run_schedule(models: list, micro_batches: list[Batch], loss_fn: Callable, forward_only: bool,
                 hooks=None) -> list:
    """Run forward (+ backward) over all micro-batches. Returns what `loss_fn` reported per micro-batch
    on the last stage ([] elsewhere). loss_fn(mb, output, non_loss_data=False) must return
    (loss_sum, count, metrics) for training, or any object when called with non_loss_data=True.
    `hooks` (e.g. models.routing.RoutingHooks): hooks.before / after(model_chunk, mb) around each forward."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    micro_batches, real = pad_to_group(models, micro_batches)  # EP > 1: the expert group's count
    longest = max(mb["tokens"].size(1) for mb in micro_batches)
    outputs = get_forward_backward_func()(
        forward_step_func=partial(_forward_step, loss_fn, hooks),
        data_iterator=iter(micro_batches),
        model=models,
        num_microbatches=len(micro_batches),
        seq_length=longest,
        micro_batch_size=micro_batches[0]["tokens"].size(0),
        forward_only=forward_only,
        collect_non_loss_data=forward_only,
    )
    return outputs[:real]  # the padding micro-batches' reports dropped


def to_device(batch: Batch, device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def forward_collect(models: list, micro_batches: list[Batch], loss_fn: Callable, keys: tuple[str, ...],
                    seq_len: int, pp_group, hooks=None) -> dict[str, torch.Tensor]:
    """Forward-only pass returning per-token outputs [B, seq_len] for `keys`, on every pipeline stage.

    The last stage computes them (loss_fn(mb, output, non_loss_data=True) -> {key: [b, s_mb]} in the row
    layout); they are padded back to seq_len, put at their rows (`row_index`), and broadcast to the other
    stages of the pipe.
    """
    with torch.no_grad():
        outputs = run_schedule(models, micro_batches, loss_fn, forward_only=True, hooks=hooks)
    num = sum(mb["row_index"].size(0) for mb in micro_batches)
    device = micro_batches[0]["tokens"].device
    rows = torch.cat([mb["row_index"] for mb in micro_batches])
    result = {}
    for key in keys:
        result[key] = torch.zeros(num, seq_len, device=device)
        if outputs:
            parts = [torch.nn.functional.pad(o[key].float(), (0, seq_len - o[key].size(1))) for o in outputs]
            result[key].index_copy_(0, rows, torch.cat(parts, dim=0))
        if pp_group.size() > 1:
            last = torch.distributed.get_process_group_ranks(pp_group)[-1]
            torch.distributed.broadcast(result[key], src=last, group=pp_group)
    return result
