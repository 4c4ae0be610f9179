"""A randomly initialised HF reward model (`*ForSequenceClassification`, one label), saved and converted for
the reward role, for runs that need all four roles without a trained reward model.

    python -m tools.bench.make_reward_model --out runs/rm --family qwen2 --hidden 896 --layers 24 --heads 14 \
        --kv-heads 2 --ffn 4864 --vocab 258

Writes OUT, the megatron dist-checkpoint `reward.model_path` takes (with the HF config in OUT/hf).
"""
from __future__ import annotations

import argparse
import tempfile

import torch

from tools import convert_checkpoint

CLASSES = {"llama": ("LlamaConfig", "LlamaForSequenceClassification"),
           "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification")}


def make_reward_model(out: str, family: str = "llama", hidden: int = 32, layers: int = 2, heads: int = 4,
                      kv_heads: int = 2, ffn: int = 64, vocab: int = 258, seed: int = 0) -> str:
    """Save a random reward model to out/hf and convert it to out; returns out (reward.model_path)."""
    import transformers

    config_cls, model_cls = (getattr(transformers, name) for name in CLASSES[family])
    torch.manual_seed(seed)
    config = config_cls(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab, num_labels=1,
                        pad_token_id=vocab - 1, tie_word_embeddings=False, architectures=[CLASSES[family][1]])
    with tempfile.TemporaryDirectory() as hf_dir:  # the conversion keeps the HF config in out/hf
        model_cls(config).save_pretrained(hf_dir)
        rc = convert_checkpoint.run(["hf-to-mcore", "--hf-dir", hf_dir, "--out", out, "--role", "reward"])
    if rc != 0:
        raise SystemExit(f"make_reward_model: conversion failed (exit {rc})")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--family", choices=sorted(CLASSES), default="llama")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--vocab", type=int, default=258)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(make_reward_model(a.out, a.family, a.hidden, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab, a.seed))


if __name__ == "__main__":
    main()
