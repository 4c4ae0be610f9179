"""Llama (and SmolLM2): the shared GPT table as is."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, ModelSpec

SPEC = ModelSpec("llama", ("llama",), ("LlamaForCausalLM", "LlamaForSequenceClassification"), BASE_WEIGHTS)
