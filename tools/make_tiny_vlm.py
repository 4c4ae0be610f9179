"""Write a tiny Qwen2.5-VL (or Qwen3-VL) directory, as transformers saves one, for CPU tests and the tiny VLM presets.

    python -m tools.make_tiny_vlm --out data/tiny_vlm            # config, tokenizer, image processor (init: random)
    python -m tools.make_tiny_vlm --out /tmp/vlm --weights       # + random weights (model.safetensors)
    python -m tools.make_tiny_vlm --family qwen3_vl --out data/tiny_vlm3   # Qwen3-VL: patch 16, DeepStack
    python -m tools.make_tiny_vlm --family qwen3_vl_moe --out data/tiny_vlm3_moe   # Qwen3-VL-MoE: 4 experts

- config.json: Qwen2_5_VLConfig, LM 2 layers, hidden 64, 4 heads / 2 KV heads (head_dim 16, M-RoPE 2 + 3 + 3);
  vision tower depth 2, hidden 32, patch 14, merge 2 (a 56 x 56 image is a 4 x 4 patch grid: 4 LM tokens).
- tokenizer.json: byte-level (ids 0-255 are the bytes, no merges) plus Qwen's special tokens from 256 on
  (`SPECIALS`), with a Qwen-style chat template that renders `{"type": "image"}` parts (a processor's) and plain
  strings alike.
- preprocessor_config.json: transformers' Qwen2-VL image processor, every image resized to 56 x 56 pixels.
- `--family qwen3_vl`: Qwen3VLConfig, the same LM shape with interleaved M-RoPE 2 + 3 + 3; tower depth 2, hidden 32,
  patch 16, merge 2, DeepStack from both blocks into LM layers 0 and 1; images resized to 64 x 64 (4 LM tokens).
- `--family qwen3_vl_moe`: Qwen3VLMoeConfig, Qwen3-VL's with 3 LM layers of 4 experts (top-2, 48 wide) and a tower of
  depth 3 with DeepStack from every block into LM layers 0-2 (SGLang's Qwen3-VL-MoE model adds exactly 3 levels).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")
IDS = {t: 256 + i for i, t in enumerate(SPECIALS)}
VOCAB = 264
SIDE = 56  # image side in pixels after the processor's resize
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
             "temporal_patch_size": 2, "min_pixels": SIDE * SIDE, "max_pixels": SIDE * SIDE,
             "size": {"shortest_edge": SIDE * SIDE, "longest_edge": SIDE * SIDE},
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}


def tiny_vlm_config(**text_overrides):
    from transformers import Qwen2_5_VLConfig

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, rms_norm_eps=1e-6,
                bos_token_id=None, eos_token_id=IDS["<|im_end|>"], pad_token_id=IDS["<|endoftext|>"],
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    text.update(text_overrides)
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=56, out_hidden_size=64,
                           fullatt_block_indexes=[1]),
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False)


SIDE3 = 64  # Qwen3-VL: patch 16 x merge 2 = 32 pixels a token side
PROCESSOR3 = {**PROCESSOR, "patch_size": 16, "min_pixels": SIDE3 * SIDE3, "max_pixels": SIDE3 * SIDE3,
              "size": {"shortest_edge": SIDE3 * SIDE3, "longest_edge": SIDE3 * SIDE3},
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def tiny_vlm3_config():
    from transformers import Qwen3VLConfig

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=512,
                rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=IDS["<|im_end|>"],
                pad_token_id=IDS["<|endoftext|>"], tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0,
                                 "mrope_interleaved": True})
    return Qwen3VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False)


def tiny_vlm3_moe_config():
    from transformers import Qwen3VLMoeConfig

    dense = tiny_vlm3_config().to_dict()
    text = {k: v for k, v in dense["text_config"].items() if k not in ("model_type", "dtype", "architectures")}
    vision = {k: v for k, v in dense["vision_config"].items() if k not in ("model_type", "dtype")}
    return Qwen3VLMoeConfig(
        text_config={**text, "num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 48, "decoder_sparse_step": 1},
        vision_config={**vision, "depth": 3, "deepstack_visual_indexes": [0, 1, 2]},
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False)


# family -> (config builder, transformers model class, preprocessor_config.json)
FAMILIES = {"qwen2_5_vl": (tiny_vlm_config, "Qwen2_5_VLForConditionalGeneration", PROCESSOR),
            "qwen3_vl": (tiny_vlm3_config, "Qwen3VLForConditionalGeneration", PROCESSOR3),
            "qwen3_vl_moe": (tiny_vlm3_moe_config, "Qwen3VLMoeForConditionalGeneration", PROCESSOR3)}


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character (what tokenizers' ByteLevel maps to)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    extra = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def tiny_tokenizer():
    """transformers' fast tokenizer over bytes with the special tokens (`SPECIALS`) and the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = byte_chars()
    core = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIALS))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_tiny_vlm(out: str | Path, weights: bool = False, seed: int = 0, family: str = "qwen2_5_vl") -> Path:
    """The directory `out` with config.json, the tokenizer, preprocessor_config.json (+ random weights)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build, model_class, processor = FAMILIES[family]
    config = build()
    config.architectures = [model_class]  # as the Hub's; SGLang picks its model class by it
    if weights:
        import torch
        import transformers

        torch.manual_seed(seed)
        getattr(transformers, model_class)(config).save_pretrained(str(out))
    else:
        config.save_pretrained(str(out))
    tiny_tokenizer().save_pretrained(str(out))
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/tiny_vlm")
    parser.add_argument("--weights", action="store_true", help="also write random weights")
    parser.add_argument("--family", default="qwen2_5_vl", choices=sorted(FAMILIES))
    args = parser.parse_args(argv)
    print(f"wrote {write_tiny_vlm(args.out, args.weights, family=args.family)}")


if __name__ == "__main__":
    main()
