"""Mistral: Llama's weights; every layer attends within config.json's sliding_window (when set)."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, ModelSpec, every_layer_slides

SPEC = ModelSpec("mistral", ("mistral",), ("MistralForCausalLM", "MistralForSequenceClassification"), BASE_WEIGHTS,
                 sliding_layers=every_layer_slides)
