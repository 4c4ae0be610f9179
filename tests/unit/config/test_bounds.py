"""Upper bounds on the size keys: absurd values are one line and exit 2 before anything is allocated; real
shapes (every preset, Llama-3 70B and 405B) pass."""
import glob
import json
import os
import time

import pytest

from rlhf_mcore.config.bounds import SIZE_BOUNDS, bound_errors
from rlhf_mcore.config.load import all_keys, load_config
from rlhf_mcore.train import main
from tests.support.reliability import ROOT, TINY

ABSURD = [  # (overrides, the key the one line names, a phrase of it)
    (["rollout.n=1e11"], "rollout.n", "largest accepted"),
    (["model.num_layers=1e26"], "model.num_layers", "64-bit"),
    (["model.num_layers=5000"], "model.num_layers", "largest accepted"),
    (["data.train_batch_size=1e9"], "data.train_batch_size", "largest accepted"),
    (["data.max_prompt_length=1e8"], "data.max_prompt_length", "largest accepted"),
    (["model.vocab_size=1e9"], "model.vocab_size", "largest accepted"),
    (["reward.num_workers=100000"], "reward.num_workers", "largest accepted"),
    (["model.num_layers=1024", "model.hidden_size=65536", "model.ffn_hidden_size=262144"], "model.hidden_size",
     "parameters"),
    (["rollout.n=65536", "data.train_batch_size=65536", "actor.ppo_mini_batch_size=65536",
      "critic.ppo_mini_batch_size=65536"], "data.train_batch_size", "TiB"),
]


@pytest.mark.parametrize("overrides,key,phrase", ABSURD, ids=[" ".join(a[0]) for a in ABSURD])
def test_absurd_size_is_one_line_exit_2(overrides, key, phrase, capsys):
    start = time.perf_counter()
    assert main(["--config", TINY, "--validate-only", *overrides]) == 2
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(f"  - {key}: ") and phrase in problems[0], err
    assert "Traceback" not in err


def test_every_bounded_key_exists():
    assert set(SIZE_BOUNDS) <= set(all_keys())


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))))
def test_presets_are_within_bounds(path):
    assert bound_errors(load_config(path, check=False)) == []


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 5e5,
         "max_position_embeddings": 131072, "vocab_size": 128256, "tie_word_embeddings": False}
SHAPES = {"70b": dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                      num_key_value_heads=8),
          "405b": dict(num_hidden_layers=126, hidden_size=16384, intermediate_size=53248, num_attention_heads=128,
                       num_key_value_heads=8)}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_large_real_shapes_validate(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **SHAPES[name]}))
    inline = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                          "num_query_groups", "vocab_size")]
    cfg = load_config(TINY, [f"model.hf_path={tmp_path}", *inline, "data.train_batch_size=1024", "rollout.n=16",
                             "data.max_prompt_length=2048", "rollout.max_response_length=16384"], check=False)
    assert bound_errors(cfg) == []
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **SHAPES[name], "num_hidden_layers": 10**6}))
    assert "num_hidden_layers is above" in bound_errors(cfg)[0]
