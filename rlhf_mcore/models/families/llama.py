"""Llama (and SmolLM2): the shared GPT table, plus a bias on every linear when config.json sets both
`attention_bias` (q, k, v and o_proj) and `mlp_bias` (gate, up, down): megatron's `add_bias_linear`. One of the
two alone is refused: megatron's layer has a single switch for the biases of all four linears."""
from rlhf_mcore.models.spec import BASE_WEIGHTS, LINEAR_BIASES, ModelSpec


def linear_biases(hf: dict) -> bool:
    return bool(hf.get("attention_bias")) and bool(hf.get("mlp_bias"))


def check(hf: dict, source: str) -> None:
    attention, mlp = bool(hf.get("attention_bias")), bool(hf.get("mlp_bias"))
    if attention != mlp:
        field, other = ("attention_bias", "mlp_bias") if attention else ("mlp_bias", "attention_bias")
        raise ValueError(f"{source}: config field '{field}'=true with '{other}'=false is not supported (megatron's "
                         "add_bias_linear biases the attention and the MLP linears together). Use a model with both "
                         "or neither.")


def config_fields(hf: dict) -> dict:
    return {"add_bias_linear": True} if linear_biases(hf) else {}


def optional_weights(hf: dict) -> tuple:
    return LINEAR_BIASES if linear_biases(hf) else ()


SPEC = ModelSpec("llama", ("llama",), ("LlamaForCausalLM", "LlamaForSequenceClassification"), BASE_WEIGHTS,
                 check=check, config_fields=config_fields, optional_weights=optional_weights)
