"""The run's tokenizer (HF dir, SentencePiece model, or `bytes` for tiny models) and its prompt samplers."""
from __future__ import annotations

import json
import logging
import os

from rlhf_mcore.tokenizer_bytes import ByteTokenizer

log = logging.getLogger(__name__)


def load_run_tokenizer(cfg):
    path = cfg.model.tokenizer or cfg.model.hf_path
    if path == "bytes":
        return ByteTokenizer()
    if not path:
        raise ValueError("model.tokenizer: no tokenizer (got ''). Set model.hf_path, model.tokenizer to a tokenizer "
                         "dir or .model file, or model.tokenizer=bytes for a tiny byte-level model.")
    from rlhf_mcore.tokenizer import load_tokenizer

    return load_tokenizer(path)


def stop_token_ids(cfg, tokenizer) -> tuple[int, ...]:
    """EOS plus any extra eos ids listed in the model's generation_config.json (e.g. chat end tokens)."""
    ids = [tokenizer.eos_id]
    gen = os.path.join(cfg.model.hf_path, "generation_config.json") if cfg.model.hf_path else ""
    if gen and os.path.isfile(gen):
        with open(gen) as f:
            extra = json.load(f).get("eos_token_id", [])
        ids += extra if isinstance(extra, list) else [extra]
    return tuple(dict.fromkeys(int(i) for i in ids))


def _load(paths: str, tokenizer, cfg):
    from rlhf_mcore.data.dataset import load_prompt_dataset

    dataset = load_prompt_dataset(paths.split(","), tokenizer, cfg.data.max_prompt_length,
                                  filter_overlong=cfg.data.filter_overlong_prompts)
    log.info("data: %d prompts from %s (%d longer than %d tokens filtered out)", len(dataset), paths,
             dataset.num_filtered, cfg.data.max_prompt_length)
    return dataset


def build_samplers(cfg, tokenizer, ctx):
    """(training PromptSampler for this DP rank, ValidationSampler or None)."""
    from rlhf_mcore.data import PromptSampler, ValidationSampler

    sampler = PromptSampler(_load(cfg.data.train_files, tokenizer, cfg), cfg.data.train_batch_size,
                            dp_rank=ctx.dp_rank, dp_size=ctx.dims.dp, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    val = ValidationSampler(_load(cfg.data.val_files, tokenizer, cfg), dp_rank=ctx.dp_rank, dp_size=ctx.dims.dp) \
        if cfg.data.val_files else None
    return sampler, val
