"""Tiny random HF MoE models (Qwen3-MoE both ways, Mixtral), built with transformers from configs (no downloads)."""
from tests.support.tiny_hf import randomize_

VOCAB = 250


def tiny_moe(norm_topk_prob: bool, seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, vocab_size=VOCAB,
                            max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    return model.eval()


def tiny_mixtral(seed: int = 0):
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=VOCAB,
                           max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    return model.eval()


# The routing-replay model: over the byte tokenizer's vocabulary (258).
NUM_LAYERS, TOPK, EXPERTS = 2, 2, 8


def save_tiny_moe(path, seed: int = 0, positions: int = 128) -> str:
    """A random tiny Qwen3MoeForCausalLM over the byte tokenizer's vocabulary (258), `positions` long."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_hidden_layers=NUM_LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=EXPERTS, num_experts_per_tok=TOPK, norm_topk_prob=True, vocab_size=258,
                            max_position_embeddings=positions, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    model.save_pretrained(str(path))
    return str(path)


def load_tiny_moe(directory, ctx):
    """`save_tiny_moe` into `directory`, built as megatron's actor on `ctx` (fp32) and loaded from it, in eval mode."""
    from rlhf_mcore.convert.mcore import build_for_conversion
    from rlhf_mcore.models.hf_io import read_hf_config
    from rlhf_mcore.models.hf_load import load_hf_weights

    path = save_tiny_moe(directory)
    hf_cfg = read_hf_config(path)
    model = build_for_conversion(hf_cfg, "actor", ctx, "fp32")
    load_hf_weights(model, path, hf_cfg, 0, 1)
    return model.eval()


# The SGLang routing-replay model (GPU): SGLang's attention kernels want head_dim 64.
GPU_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=256, intermediate_size=512,
               moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, vocab_size=258,
               max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
               decoder_sparse_step=1, mlp_only_layers=[])


def gpu_moe_dir(path) -> str:
    """A tiny Qwen3-MoE config.json SGLang's kernels take (head_dim 64; R3 on a GPU); random weights come from
    `model.init`."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(GPU_MOE))
    return str(path)

