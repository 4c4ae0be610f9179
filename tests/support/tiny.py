"""Tiny mcore model configs shared by in-process tests (hidden 64, 2 layers, GQA 4/2, vocab 250)."""


def tiny_model_config(**overrides):
    """A tiny Llama-shaped Config (hidden 64, 2 layers, GQA 4/2, vocab 250)."""
    from rlhf_mcore.config import Config, ModelConfig

    fields = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  vocab_size=250)
    fields.update(overrides)
    return Config(model=ModelConfig(**fields))
