"""The architecture a role was saved from, recorded in `checkpoint.json` and compared before any load.

Shapes alone do not catch every change: 8 heads of 8 and 4 heads of 16 give the same fused QKV weight, so a
checkpoint saved with one loads into the other, and trains on with scrambled attention. Each role's entry of
`checkpoint.json` holds `architecture_of(model)`; `architecture_mismatch` names every field that differs.
A checkpoint written before this was recorded has none, and loads as before (shape checks only).
"""
from __future__ import annotations

import json
from pathlib import Path

from rlhf_mcore.models.full_weights import unwrap_model

# megatron TransformerConfig fields that fix how the weights are read
CONFIG_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                 "kv_channels", "num_moe_experts", "moe_router_topk")


def architecture_of(model) -> dict:
    """{field: value} of a built model: its config's CONFIG_FIELDS, its family and its (unpadded) vocabulary."""
    inner = unwrap_model(model)
    arch = {field: getattr(inner.config, field, None) for field in CONFIG_FIELDS}
    arch["family"] = getattr(inner, "family", None)
    arch["vocab_size"] = getattr(inner, "vocab_size_unpadded", None)
    return arch


def architecture_mismatch(saved: dict | None, now: dict) -> list[str]:
    """'field: saved X, this run Y' for every field both record (not None) and that differ ([] for no record)."""
    if not saved:
        return []
    return [f"{field}: saved {saved[field]}, this run {now[field]}" for field in sorted(set(saved) & set(now))
            if None not in (saved[field], now[field]) and saved[field] != now[field]]


# a converted checkpoint's hf/config.json field -> ours
HF_FIELDS = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads":
             "num_attention_heads", "num_key_value_heads": "num_query_groups", "vocab_size": "vocab_size"}


def saved_architecture(weights_dir: Path, meta_file: str) -> dict | None:
    """What a `model.load` directory was saved from: its role's record in the training checkpoint around it, or
    the HF config a converted checkpoint keeps in hf/config.json; None when neither is there."""
    meta = weights_dir.parent / meta_file
    if meta.is_file():
        return json.loads(meta.read_text()).get("roles", {}).get(weights_dir.name, {}).get("architecture")
    hf = weights_dir / "hf" / "config.json"
    if hf.is_file():
        config = json.loads(hf.read_text())
        return {ours: config[theirs] for theirs, ours in HF_FIELDS.items() if theirs in config}
    return None
