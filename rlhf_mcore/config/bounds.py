"""Upper bounds on every size key, and memory estimates for what the sizes add up to, checked before anything is
allocated: `rollout.n=1e11` or `model.num_layers=1e26` is one config error, not minutes of allocation ending in
a MemoryError or an OverflowError.

Each bound is far above any real run (a 405B model has 126 layers, hidden size 16384 and a 128k vocabulary;
its configs validate), so it only refuses values that cannot be meant. The estimates add up the
architecture's parameters and the tokens of one step's rollout batch, and refuse what no cluster holds.
"""
from __future__ import annotations

import json
import os

from rlhf_mcore.config.schema import Config

SIZE_BOUNDS = {  # dotted key: the largest value accepted
    "model.num_layers": 1024, "model.hidden_size": 1 << 17, "model.ffn_hidden_size": 1 << 20,
    "model.num_attention_heads": 1024, "model.num_query_groups": 1024, "model.vocab_size": 1 << 24,
    "model.max_position_embeddings": 1 << 24, "model.make_vocab_size_divisible_by": 1 << 16,
    "parallel.tp": 4096, "parallel.pp": 4096, "parallel.cp": 4096,
    "data.train_batch_size": 1 << 20, "data.val_batch_size": 1 << 20, "data.max_prompt_length": 1 << 22,
    "rollout.n": 1 << 16, "rollout.max_response_length": 1 << 22, "rollout.micro_batch_size": 1 << 20,
    "rollout.top_k": 1 << 24, "rollout.sglang.cuda_graph_max_bs": 1 << 16, "rollout.sglang.weight_bucket_mb": 1 << 20,
    "actor.ppo_mini_batch_size": 1 << 20, "actor.ppo_epochs": 1000, "actor.micro_batch_size_per_gpu": 1 << 16,
    "actor.max_tokens_per_gpu": 1 << 30, "actor.log_prob_max_tokens_per_gpu": 1 << 30,
    "critic.ppo_mini_batch_size": 1 << 20, "critic.ppo_epochs": 1000,
    "critic.micro_batch_size_per_gpu": 1 << 16, "critic.max_tokens_per_gpu": 1 << 30,
    "reward.num_workers": 1024, "algorithm.filter_groups.max_num_gen_batches": 1 << 20,
}
HF_BOUNDS = {  # config.json field: the schema key whose bound applies
    "num_hidden_layers": "model.num_layers", "hidden_size": "model.hidden_size",
    "intermediate_size": "model.ffn_hidden_size", "num_attention_heads": "model.num_attention_heads",
    "num_key_value_heads": "model.num_query_groups", "vocab_size": "model.vocab_size",
    "max_position_embeddings": "model.max_position_embeddings",
}
MAX_PARAMS = 10 ** 13  # 10T parameters: 160 TB of weights, gradients and Adam state
BYTES_PER_PARAM = 16  # bf16 weights + fp32 master weights and gradients + Adam's two moments (roughly)
MAX_BATCH_BYTES = 1 << 40  # one step's rollout batch over all ranks
BYTES_PER_TOKEN = 48  # ids, masks, log-probs (old, ref, new), values, advantages, returns per token


def _get(cfg, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _key_errors(cfg: Config) -> list[str]:
    errs = []
    for key, bound in SIZE_BOUNDS.items():
        value = _get(cfg, key)
        if value is not None and value > bound:
            errs.append(f"{key}: above the largest accepted value {bound} (got {value}). No run needs more; set "
                        "the value you meant.")
    return errs


def _read_hf(cfg: Config) -> tuple[dict | None, str]:
    path = os.path.join(cfg.model.hf_path, "config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
    except (OSError, ValueError):
        return None, path  # unreadable: validate._model_shape says so
    return (hf.get("text_config") or hf if isinstance(hf, dict) else None), path


def _hf_errors(hf: dict, path: str) -> list[str]:
    errs = []
    for field, key in HF_BOUNDS.items():
        value = hf.get(field)
        if isinstance(value, (int, float)) and value > SIZE_BOUNDS[key]:
            errs.append(f"{path}: {field} is above the largest accepted value {SIZE_BOUNDS[key]} (got {value}). "
                        "Check the model directory.")
    return errs


def num_params_estimate(layers: int, hidden: int, ffn: int, heads: int, groups: int, vocab: int, tied: bool,
                        experts: int = 1) -> int:
    """Parameters of a Llama-shaped decoder (attention with grouped KV, a gated MLP per expert, embeddings).

    >>> f"{num_params_estimate(80, 8192, 28672, 64, 8, 128256, False):.3g}"  # Llama-3 70B
    '7.06e+10'
    """
    kv = hidden * groups // max(heads, 1)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn * experts
    return layers * per_layer + (1 if tied else 2) * vocab * hidden


def _shape(cfg: Config, hf: dict | None) -> tuple | None:
    m = cfg.model
    if hf is None:
        values = (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
                  m.num_query_groups or m.num_attention_heads, m.vocab_size, m.tie_embeddings, 1)
    else:
        experts = hf.get("num_experts") or hf.get("num_local_experts") or 1
        ffn = hf.get("moe_intermediate_size") if experts > 1 and hf.get("moe_intermediate_size") else \
            hf.get("intermediate_size")
        values = (hf.get("num_hidden_layers"), hf.get("hidden_size"), ffn, hf.get("num_attention_heads"),
                  hf.get("num_key_value_heads") or hf.get("num_attention_heads"), hf.get("vocab_size"),
                  bool(hf.get("tie_word_embeddings")), experts)
    return values if all(isinstance(v, (int, bool)) for v in values) else None


def _memory_errors(cfg: Config, hf: dict | None) -> list[str]:
    errs, shape = [], _shape(cfg, hf)
    if shape is not None:
        params = num_params_estimate(*shape)
        if params > MAX_PARAMS:
            key = "model.hf_path" if cfg.model.hf_path else "model.hidden_size"
            errs.append(f"{key}: the architecture has about {params:.3g} parameters, {params * BYTES_PER_PARAM:.3g} "
                        f"bytes of weights, gradients and Adam state (got layers={shape[0]}, hidden={shape[1]}, "
                        f"ffn={shape[2]}, vocab={shape[5]}); more than any cluster holds (limit {MAX_PARAMS:.0e}). "
                        "Set the shape you meant.")
    d, r = cfg.data, cfg.rollout
    tokens = d.train_batch_size * r.n * (d.max_prompt_length + r.max_response_length)
    if tokens * BYTES_PER_TOKEN > MAX_BATCH_BYTES:
        key = "rollout.n" if r.n > d.train_batch_size else "data.train_batch_size"
        errs.append(f"{key}: one step's rollout batch of data.train_batch_size*rollout.n = {d.train_batch_size * r.n} "
                    f"samples x {d.max_prompt_length + r.max_response_length} tokens needs about "
                    f"{tokens * BYTES_PER_TOKEN / 2**40:.3g} TiB (got {_get(cfg, key)}); the limit is "
                    f"{MAX_BATCH_BYTES / 2**40:.0f} TiB. Lower data.train_batch_size, rollout.n or the lengths.")
    return errs


def bound_errors(cfg: Config) -> list[str]:
    """Every size above its bound, then (when all are in bounds) every estimate that cannot fit."""
    errs = _key_errors(cfg)
    hf, path = _read_hf(cfg) if cfg.model.hf_path else (None, "")
    if hf is not None:
        errs += _hf_errors(hf, path)
    return errs or _memory_errors(cfg, hf)
