"""Every architecture the model builder refuses, `--validate-only` refuses first: exit 2, one line per config.json
field, naming the field and what to do, and no traceback. The table below walks the builder's refusals
(`models.transformer_config.architecture_errors`, the families' checks, RoPE scaling); for each row the builder
raises the very lines that validation printed."""
import json
from types import SimpleNamespace

import pytest

from rlhf_mcore.models.transformer_config import to_transformer_config
from tests.support.paths import ROOT
from tests.support.tiny_hf import save_tiny
from tests.support.validate_only import validate_only_errors

TINY = str(ROOT / "configs" / "tiny_grpo.yaml")
BLANK = ["model.num_layers=null", "model.hidden_size=null", "model.ffn_hidden_size=null",
         "model.num_attention_heads=null", "model.num_query_groups=null", "model.vocab_size=null"]

# (case of tests/support/tiny_hf.py, config.json changes, the start of each expected line after the source)
REFUSALS = {
    "activation": ("llama_tied", {"hidden_act": "xielu"}, ["hidden_act 'xielu' is not supported (field hidden_act)"]),
    "mlp_bias_alone": ("llama_tied", {"mlp_bias": True},
                       ["config field 'mlp_bias'=true with 'attention_bias'=false is not supported"]),
    "o_proj_bias_alone": ("llama_tied", {"attention_bias": True},
                          ["config field 'attention_bias'=true with 'mlp_bias'=false is not supported"]),
    "qwen3_o_proj_bias": ("qwen3", {"attention_bias": True},
                          ["config field 'attention_bias'=true is not supported for qwen3"]),
    "rope_scaling": ("qwen2", {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}},
                     ["rope scaling type 'longrope' is not supported (field rope_scaling)"]),
    "yarn_factor": ("qwen2", {"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 256}},
                    ["rope_scaling.factor is missing for rope type 'yarn'"]),
    "missing_field": ("qwen3", {"intermediate_size": None}, ["missing required field 'intermediate_size'"]),
    "architecture": ("llama_tied", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
                     ["unsupported architecture (architectures=['GPT2LMHeadModel'], model_type='gpt2')"]),
    "two_at_once": ("mistral", {"hidden_act": "relu6", "mlp_bias": True},
                    ["hidden_act 'relu6' is not supported", "config field 'mlp_bias'=true is not supported"]),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_validation_refuses_what_the_builder_refuses(name, tmp_path, capsys):
    case, changes, starts = REFUSALS[name]
    hf_dir = save_tiny(tmp_path / "hf", case)
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (hf_dir / "config.json").write_text(json.dumps(config))
    lines = validate_only_errors(capsys, TINY, *BLANK, f"model.hf_path={hf_dir}")
    source = f"model.hf_path: {hf_dir}/config.json: "
    assert [line[:len(source)] for line in lines] == [source] * len(starts), lines
    assert [line[len(source):len(source) + len(s)] for line, s in zip(lines, starts)] == starts, lines
    with pytest.raises(ValueError) as built:
        to_transformer_config(config, SimpleNamespace(dtype="fp32", recompute="none", init_std=0.02),
                              SimpleNamespace(tp=1, pp=1, ep=1, sequence_parallel=False), f"{source[:-2]}")
    assert str(built.value).splitlines() == lines  # the builder's refusal is what validation printed


@pytest.mark.parametrize("case", ["qwen3", "llama_bias", "llama_gelu", "qwen2_yarn"])
def test_a_supported_model_validates(case, tmp_path, capsys):
    assert validate_only_errors(capsys, TINY, *BLANK, f"model.hf_path={save_tiny(tmp_path / 'hf', case)}") == []
