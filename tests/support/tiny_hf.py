"""Tiny random HF checkpoints of every family, built from configs with transformers (no downloads).

Shared by tests/tools/ and tests/models/test_weights*.py (imported by path; not a test module).
hidden 64, 4 layers (two pipeline stages of two), GQA 4 heads / 2 KV heads, vocab 250 (not a multiple of
128, so vocab padding is exercised). Weights are drawn with a fixed seed and are far from the HF init
(biases and norm scales included) so that a swapped tensor cannot go unnoticed.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

VOCAB = 250
# case name -> (family, tie_word_embeddings)
CASES = {"llama_tied": ("llama", True), "qwen2": ("qwen2", False), "mistral": ("mistral", False),
         "qwen2_tied": ("qwen2", True), "qwen3": ("qwen3", False), "llama31": ("llama", False),
         "llama32_tied": ("llama", True), "qwen2_linear": ("qwen2", False), "qwen3_window": ("qwen3", False),
         "qwen2_window": ("qwen2", False), "mistral_window": ("mistral", False), "llama_bias": ("llama", False),
         "llama_gelu": ("llama", True),
         "qwen2_yarn": ("qwen2", False)}
FAMILY_FIELDS = {"qwen3": {"head_dim": 24}}  # Qwen3: head_dim differs from hidden / heads (16)


def llama3_rope(factor: float) -> dict:
    """Llama 3.1 / 3.2's RoPE scaling, its original context shrunk to 32 so that a 12-token test sequence sees
    every regime (head_dim 16: a kept, a blended and six scaled frequencies)."""
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}


# Qwen2.5's YaRN (factor 4) over an original context of 256: at head_dim 16 that keeps one frequency, blends three
# and divides four by the factor; cos / sin are scaled by 0.1 ln 4 + 1 at every position.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0}
CASE_FIELDS = {"llama31": {"rope_scaling": llama3_rope(8.0)}, "llama32_tied": {"rope_scaling": llama3_rope(32.0)},
               "qwen2_linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
               # sliding windows of 8 tokens: Qwen's on the layers from max_window_layers on, Mistral's on every one
               "qwen3_window": {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
               "qwen2_window": {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
               "mistral_window": {"sliding_window": 8},
               "llama_bias": {"attention_bias": True, "mlp_bias": True},  # a bias on every linear (add_bias_linear)
               "llama_gelu": {"hidden_act": "gelu_pytorch_tanh"},  # GeGLU
               "qwen2_yarn": {"rope_scaling": YARN, "max_position_embeddings": 1024}}
# llama_bias: the TP split of every linear's bias; llama_tied last: tied embeddings + PP need cpu_compat
DIST_CASES = ("qwen2", "mistral", "llama31", "llama_bias", "qwen2_yarn", "llama_tied")


def case_model(case: str, **kw):
    """The random HF model of `case` (one of CASES)."""
    family, tied = CASES[case]
    return tiny_model(family, tied, **{**CASE_FIELDS.get(case, {}), **kw})


def tiny_config(family: str, tied: bool, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig, "qwen3": Qwen3Config}[family]
    fields = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, tie_word_embeddings=tied,
                  rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    fields.update(FAMILY_FIELDS.get(family, {}), **overrides)
    return cls(**fields)


def randomize_(model, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def tiny_model(family: str, tied: bool, seq_cls: bool = False, seed: int = 0, **overrides):
    """A random HF model (causal LM, or *ForSequenceClassification with one label)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = tiny_config(family, tied, **overrides)
    if seq_cls:
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    return model.eval()


def save_tiny(out_dir: Path, case: str, seq_cls: bool = False, dtype=torch.float32) -> Path:
    """Write a tiny HF checkpoint directory for `case` (one of CASES) and return it."""
    model = case_model(case, seq_cls=seq_cls).to(dtype)
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def load_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    from rlhf_mcore.models.hf_io import load_hf_state_dict

    return load_hf_state_dict(hf_dir)[0]


def diff_state_dicts(expected: dict, actual: dict) -> list[str]:
    """Human-readable differences: missing keys, unexpected keys, and tensors that are not bitwise equal."""
    problems = [f"missing {k}" for k in sorted(set(expected) - set(actual))]
    problems += [f"unexpected {k}" for k in sorted(set(actual) - set(expected))]
    for key in sorted(set(expected) & set(actual)):
        a, b = expected[key], actual[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{key}: {tuple(a.shape)} {a.dtype} != {tuple(b.shape)} {b.dtype}")
        elif not torch.equal(a, b):
            problems.append(f"{key}: max abs diff {(a.float() - b.float()).abs().max().item():.3e}")
    return problems


def parse_verify_lines(text: str) -> list[dict]:
    """The `verify key=value ... PASS|FAIL` lines printed by convert_checkpoint.py verify."""
    rows = []
    for line in text.splitlines():
        if line.startswith("verify ckpt="):
            row = dict(re.findall(r"(\w+)=(\S+)", line))
            row["passed"] = line.rstrip().endswith("PASS")
            rows.append(row)
    return rows


def max_logit_error(hf, ours, tp_group, vocab: int = VOCAB) -> float:
    """max |transformers logits - ours| on two fixed random rows of 17 tokens (fp32, no grad)."""
    from rlhf_mcore.models.logprobs import full_logits

    tokens = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        return (hf(tokens).logits - full_logits(ours, ours(tokens, pos, None), tp_group)).abs().max().item()


def tiny_reward_model():
    """A random 2-layer LlamaForSequenceClassification over the byte tokenizer's vocabulary (258, pad 257), one
    label, with transformers' own init (draw with torch's global RNG: seed it first)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=258, num_labels=1, pad_token_id=257,
                         architectures=["LlamaForSequenceClassification"])
    return LlamaForSequenceClassification(config).eval()
