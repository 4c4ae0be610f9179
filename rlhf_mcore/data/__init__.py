"""Prompt data: verl-schema parquet -> validated, tokenised rows -> per-DP-rank batches.

What the trainer calls::

    ds = load_prompt_dataset(cfg.data.train_files, tokenizer, cfg.data.max_prompt_length)
    sampler = PromptSampler(ds, cfg.data.train_batch_size, dp_rank=r, dp_size=dp, seed=seed)
    rows = sampler.next_batch()          # this rank's rows (PromptRow: prompt_ids, data_source, ...)
    val = ValidationSampler(val_ds, dp_rank=r, dp_size=dp)
    rows, keep = val.shard()             # keep=False on padding duplicates: drop them from metrics
"""
from rlhf_mcore.data.dataset import PromptDataset, build_prompt_dataset, load_prompt_dataset, tokenize_prompt
from rlhf_mcore.data.io import read_jsonl, read_parquet_rows, write_prompt_parquet
from rlhf_mcore.data.sampler import PromptSampler, epoch_order, global_batch, rank_shard
from rlhf_mcore.data.schema import PromptRow, check_row, make_row
from rlhf_mcore.data.validation import ValidationSampler, validation_shard

__all__ = [
    "PromptDataset", "PromptRow", "PromptSampler", "ValidationSampler", "build_prompt_dataset", "check_row",
    "epoch_order", "global_batch", "load_prompt_dataset", "make_row", "rank_shard", "read_jsonl",
    "read_parquet_rows", "tokenize_prompt", "validation_shard", "write_prompt_parquet",
]
