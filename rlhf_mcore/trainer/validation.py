"""Validation: `rollout.val_n` samples per prompt (greedy by default: `rollout.val_temperature`, `val_top_p`,
`val_top_k`, `val_do_sample`, verl's val_kwargs) over the whole validation set, sharded over DP in chunks of
`data.val_batch_size` prompts, scored like training. Metrics use verl's names, per data_source:
`val-core/<data_source>/{acc,reward,format}/mean@N`, and with N > 1 also `.../best@N/mean` and `.../worst@N/mean`
(a prompt's best and worst of its N samples, averaged over prompts); plus `val-aux/response_length/mean` and
`val-aux/response_length/clip_ratio` (share of responses cut at rollout.max_response_length) over all samples."""
from __future__ import annotations

import logging

import torch

from rlhf_mcore.logs import progress
from rlhf_mcore.trainer.dumps import sample_records, write_records
from rlhf_mcore.trainer.phases import decode_responses, sampling_params
from rlhf_mcore.trainer.scoring import gather_source_sums, merge_source_sums, source_means, source_sums

log = logging.getLogger("rlhf_mcore")
SAMPLE_QUESTION_CHARS = 300


def format_sample(question: str, response: str, ground_truth, scored: dict) -> str:
    """One validation sample for the log: the end of the question and the whole response, delimited.

    >>> print(format_sample("What is 2+2?", "4\\n#### 4", "4", {"reward": 1.0, "acc": 1.0, "format": 1.0}))
    validation sample (reward 1.000, acc 1, format 1, ground truth 4)
    ----- question (last 300 chars) -----
    What is 2+2?
    ----- response -----
    4
    #### 4
    ----- end -----
    """
    cut = "..." if len(question) > SAMPLE_QUESTION_CHARS else ""
    head = (f"validation sample (reward {scored['reward']:.3f}, acc {scored['acc']:.0f}, "
            f"format {scored['format']:.0f}, ground truth {ground_truth})")
    return "\n".join([head, f"----- question (last {SAMPLE_QUESTION_CHARS} chars) -----",
                      cut + question[-SAMPLE_QUESTION_CHARS:], "----- response -----", response, "----- end -----"])


def length_sums(lengths: torch.Tensor, keep: list[bool], max_length: int) -> list[float]:
    """[sum of lengths, kept rows, rows cut at max_length] over the kept rows.

    >>> length_sums(torch.tensor([3, 8, 8]), [True, True, False], 8)
    [11.0, 2.0, 1.0]
    """
    kept = torch.tensor(keep, dtype=torch.bool)
    lengths = lengths.cpu()[kept].float()
    return [float(lengths.sum()), float(kept.sum()), float((lengths >= max_length).sum())]


def at_n_columns(columns: dict[str, list[float]], n: int) -> dict[str, list[float]]:
    """Per prompt, from its n consecutive rows: `<name>/mean@n`, and for n > 1 `<name>/best@n/mean` and
    `<name>/worst@n/mean` (verl's names).

    >>> at_n_columns({"acc": [1.0, 0.0, 0.0, 0.0]}, 2)
    {'acc/mean@2': [0.5, 0.0], 'acc/best@2/mean': [1.0, 0.0], 'acc/worst@2/mean': [0.0, 0.0]}
    >>> at_n_columns({"acc": [1.0, 0.0]}, 1)
    {'acc/mean@1': [1.0, 0.0]}
    """
    out: dict[str, list[float]] = {}
    for name, values in columns.items():
        groups = [values[i:i + n] for i in range(0, len(values), n)]
        out[f"{name}/mean@{n}"] = [sum(g) / n for g in groups]
        if n > 1:
            out[f"{name}/best@{n}/mean"] = [max(g) for g in groups]
            out[f"{name}/worst@{n}/mean"] = [min(g) for g in groups]
    return out


def validate(run, step: int = 0) -> dict[str, float]:
    cfg, ctx = run.cfg, run.ctx
    sums: dict = {}
    totals = torch.zeros(3, dtype=torch.float64)
    num_prompts = len(run.val_sampler.indices)
    shown = False
    n = cfg.rollout.val_n
    records: list[dict] = []
    with progress(num_prompts, "validation", ctx.is_logging_rank, unit="prompts") as bar:
        for prompts, keep in run.val_sampler.batches(cfg.data.val_batch_size):
            rollout = run.rollout.generate(prompts, sampling_params(cfg, run.stop_ids, 0, validation=True),
                                           show_progress=ctx.is_logging_rank)  # in rollout.mode, as training
            responses = decode_responses(rollout, run.tokenizer.decode)
            scored = run.scorer.score(rollout, prompts, n, responses)
            columns = scored.columns()
            per_prompt = at_n_columns(columns, n)
            if cfg.trainer.validation_data_dir:  # verl's dump of every validation sample (padding rows left out)
                found = sample_records(rollout, prompts, n, run.tokenizer.decode, columns, step)
                records += [r for j, r in enumerate(found) if keep[j // n]]
            sums = merge_source_sums([sums, source_sums([p.data_source for p in prompts], per_prompt, keep)])
            keep_rows = [k for k in keep for _ in range(n)]
            totals += torch.tensor(length_sums(rollout.loss_mask.sum(-1), keep_rows, cfg.rollout.max_response_length),
                                   dtype=torch.float64)
            if ctx.is_logging_rank and prompts and not shown:  # one sample, so users see what the model writes
                log.info(format_sample(prompts[0].messages[-1]["content"], responses[0], prompts[0].ground_truth,
                                       {k: v[0] for k, v in columns.items()}))
                shown = True
            bar.update(len(prompts))
    sums = gather_source_sums(sums, ctx)
    if ctx.dims.dp > 1:
        totals = totals.to(ctx.device)
        torch.distributed.all_reduce(totals, group=ctx.pgs.dp)
        totals = totals.cpu()
    if cfg.trainer.validation_data_dir:
        write_records(cfg.trainer.validation_data_dir, step, records, ctx)
    metrics = source_means(sums, "val-core/{src}/{name}")
    metrics["val-aux/response_length/mean"] = float(totals[0] / totals[1].clamp(min=1))
    metrics["val-aux/response_length/clip_ratio"] = float(totals[2] / totals[1].clamp(min=1))
    return metrics
