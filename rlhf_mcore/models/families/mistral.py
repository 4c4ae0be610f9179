"""Mistral: Llama's weights; config.json's sliding_window is honoured (it must cover the sequence)."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, ModelSpec

SPEC = ModelSpec("mistral", ("mistral",), ("MistralForCausalLM", "MistralForSequenceClassification"), BASE_WEIGHTS,
                 has_sliding_window=True)
