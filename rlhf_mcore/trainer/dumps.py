"""What the model wrote, on disk: verl's `trainer.rollout_data_dir` (every training sample of a step) and
`trainer.validation_data_dir` (every validation sample), one JSONL file per step, `<dir>/<step>.jsonl`.

A record per sample: `step`, `data_source`, `input` (the prompt as the model saw it, chat template included),
`output` (the response; multi-turn: the tool turns too), `ground_truth`, and the sample's scores (`reward`, `acc`,
`format`). Every DP replica's rows reach global rank 0 (one all_gather_object over DP among the ranks at TP and PP
rank 0, whose replicas hold the same rows), which writes the file atomically: a temporary file, renamed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist


def sample_records(rollout, prompts, n: int, decode, columns: dict[str, list[float]], step: int) -> list[dict]:
    """One record per row of `rollout` (row i: sample i % n of prompts[i // n]); `columns`: per-row scores."""
    records = []
    for i in range(rollout.tokens.size(0)):
        prompt = prompts[i // n]
        start, length = int(rollout.prompt_lengths[i]), int(rollout.response_lengths[i])
        tokens = rollout.tokens[i].tolist()
        records.append({"step": step, "data_source": prompt.data_source, "input": decode(tokens[:start]),
                        "output": decode(tokens[start:start + length]), "ground_truth": prompt.ground_truth,
                        **{name: float(values[i]) for name, values in columns.items()}})
    return records


def write_records(directory: str, step: int, records: list[dict], ctx) -> str | None:
    """Collective over the ranks at TP and PP rank 0: gather every replica's `records` and write them to
    `<directory>/<step>.jsonl` on global rank 0 (its path there, None elsewhere)."""
    if ctx.tp_rank != 0 or ctx.pp_rank != 0:
        return None
    if ctx.dims.dp > 1:
        parts: list = [None] * ctx.dims.dp
        dist.all_gather_object(parts, records, group=ctx.pgs.dp)
        records = [r for part in parts for r in part]
    if ctx.rank != 0:
        return None
    path = Path(directory) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")
    os.replace(tmp, path)
    return str(path)
