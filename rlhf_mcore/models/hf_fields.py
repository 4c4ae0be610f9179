"""The model section's architecture fields <-> an HF `config.json` dict, both ways (no torch: the config
printer and `--validate-only` use it).

`hf_config_from_model_config`: inline fields -> the HF dict of that family (a run without model.hf_path).
`model_fields_from_hf`: an HF dict -> the values those fields take in the run (what `--validate-only` and
`run_dir/config.yaml` show when the architecture comes from model.hf_path).
"""
from __future__ import annotations

from rlhf_mcore.models.registry import MODEL_FAMILIES, spec_for_hf_config

ARCH_FIELDS = ("family", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
               "vocab_size", "max_position_embeddings", "rope_theta", "norm_eps", "tie_embeddings", "init_std")


def hf_config_from_model_config(m) -> dict:
    """Inline model fields -> the HF config dict of that family (what transformers would write)."""
    spec = MODEL_FAMILIES.get(m.family)
    return {
        "architectures": [spec.architectures[0]],
        "model_type": spec.model_types[0],
        "num_hidden_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_query_groups or m.num_attention_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rope_theta": m.rope_theta,
        "rms_norm_eps": m.norm_eps,
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": spec.qkv_bias,
        "initializer_range": m.init_std,
    }


def model_fields_from_hf(hf: dict, source: str = "config.json", init_std: float = 0.02) -> dict:
    """The architecture fields (ARCH_FIELDS) as the run takes them from an HF config dict (`init_std`: the
    model section's, used where config.json has no initializer_range, as the model build does).

    >>> f = model_fields_from_hf({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
    ...     "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
    ...     "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000,
    ...     "rms_norm_eps": 1e-05, "tie_word_embeddings": True})
    >>> f["family"], f["tie_embeddings"], f["rope_theta"], f["num_query_groups"]
    ('llama', True, 100000.0, 3)
    """
    hf = spec_for_hf_config(hf, source).text_config(hf)  # a vision-language config.json nests the LM's fields
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    heads = hf.get("num_attention_heads")
    return {
        "family": spec_for_hf_config(hf, source).name,
        "num_layers": hf.get("num_hidden_layers"),
        "hidden_size": hf.get("hidden_size"),
        "ffn_hidden_size": hf.get("intermediate_size"),
        "num_attention_heads": heads,
        "num_query_groups": hf.get("num_key_value_heads") or heads,
        "vocab_size": hf.get("vocab_size"),
        "max_position_embeddings": hf.get("max_position_embeddings"),
        "rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
        "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "init_std": float(hf.get("initializer_range", init_std)),
    }
