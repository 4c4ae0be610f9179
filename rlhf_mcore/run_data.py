"""The run's tokenizer (HF dir, SentencePiece model, or `bytes` for tiny models) and its prompt samplers."""
from __future__ import annotations

import json
import os

from rlhf_mcore.tokenizer_bytes import ByteTokenizer


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


def build_samplers(cfg, tokenizer, ctx):
    raise NotImplementedError("waiting for rlhf_mcore.data")
