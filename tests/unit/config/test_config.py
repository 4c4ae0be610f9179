"""Config: loading, overrides, every error path, the frozen key surface, and the CLI's exit codes."""
import glob
import json
import os

import pytest

from rlhf_mcore.config.load import ConfigError, all_keys, load_config
from tests.support.paths import ROOT_STR as ROOT
from tests.support.shapes import HF_SHAPES
from tools.bench.vision_bench import SHAPES as VL_SHAPES
from tools.bench.vision_bench import write_vlm_dir

TINY = os.path.join(ROOT, "configs", "tiny_grpo.yaml")
GOLDEN = os.path.join(os.path.dirname(__file__), "golden_config_keys.txt")


def errors_of(overrides, path=TINY, world_size=None):
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, world_size=world_size)
    return info.value.errors


def test_key_surface_is_frozen():
    """Adding or renaming a key is a user-visible change: update the golden list on purpose."""
    with open(GOLDEN) as f:
        golden = f.read().split()
    assert all_keys() == golden


def test_overrides_are_coerced_to_field_types():
    cfg = load_config(TINY, ["actor.optim.lr=3e-4", "rollout.n=8", "trainer.logger=console,jsonl",
                             "parallel.sequence_parallel=false", "model.num_query_groups=null",
                             "rollout.stop=[\"</s>\", \"\\n\\n\"]", "data.train_batch_size=8"])
    assert cfg.actor.optim.lr == 3e-4 and cfg.rollout.n == 8
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.model.num_query_groups is None
    assert cfg.rollout.stop == ["</s>", "\n\n"]


def test_unknown_key_suggests_the_closest():
    (err,) = errors_of(["actor.optim.learning_rat=1"])
    assert err.startswith("actor.optim.learning_rat: unknown key")
    (err,) = errors_of(["rollout.temprature=0.5"])
    assert "Did you mean 'temperature'?" in err


def test_unknown_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(open(TINY).read().replace("algorithm:\n", "algorithm:\n  adv_estimater: gae\n"))
    errs = errors_of([], path=str(path))
    assert any(e.startswith("algorithm.adv_estimater: unknown key") and "adv_estimator" in e for e in errs)


@pytest.mark.parametrize("override, expected", [
    ("rollout.n=two", "rollout.n: expected int (got 'two'). Write a whole number."),
    ("actor.optim.lr=fast", "actor.optim.lr: expected float (got 'fast')."),
    ("data.shuffle=maybe", "data.shuffle: expected true or false (got 'maybe')."),
    ("rollout.n=2.5", "rollout.n: expected int (got '2.5')."),
    ("model.dtype=fp8", "model.dtype: must be one of fp32, bf16 (got 'fp8')."),
    ("rollout.top_p=1.5", "rollout.top_p: must be in (0, 1] (got 1.5)."),
    ("rollout.top_k=0", "rollout.top_k: must be -1 (off) or >= 1 (got 0)."),
    ("rollout.engine=vllm", "rollout.engine: must be one of native, sglang (got 'vllm')."),
    ("parallel.cp=2", "parallel.cp: context parallelism is not supported yet (got 2)."),
    ("actor.loss_agg_mode=sum", "actor.loss_agg_mode: must be one of token-mean"),
    ("trainer.logger=wandbb", "trainer.logger: must be one of console, jsonl, tensorboard, wandb (got 'wandbb')."),
    ("reward.format_score=1.0", "reward.format_score: must be below the score of a correct answer, 1.0 (got 1.0)."),
    ("parallel.tp=3", "parallel.tp: must divide the number of attention heads 4 (got 3)."),
    ("parallel.pp=3", "parallel.pp: must divide the number of layers 4 (got 3)."),
    ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator: unknown name (got 'ppo'). Available:"),
    ("actor.policy_loss=ppo", "actor.policy_loss: unknown name (got 'ppo'). Available:"),
    ("actor.kl_loss_type=k9", "actor.kl_loss_type: unknown name (got 'k9')."),
    ("rollout.n=1", "rollout.n: grpo compares samples of the same prompt and needs at least 2 (got 1)."),
    ("actor.ppo_mini_batch_size=3", "actor.ppo_mini_batch_size: must divide data.train_batch_size=4 (got 3)."),
    ("actor.micro_batch_size_per_gpu=3", "actor.micro_batch_size_per_gpu: must divide the per-rank mini-batch"),
    ("data.train_files=/nope.parquet", "data.train_files: file not found (got '/nope.parquet')."),
    ("reward.custom_fn=nofile.py", "reward.custom_fn: expected an existing path/to/file.py:function_name"),
    ("model.hf_path=/nope", "model.num_layers: set inline while model.hf_path is given (got 4)."),
    ("model.family=gpt2", "model.family: unknown family (got 'gpt2')."),
    ("parallel.sequence_parallel=true", "parallel.sequence_parallel: needs tp > 1 (got true with tp=1)."),
    ("parallel.tp=2 parallel.sequence_parallel=true", "parallel.sequence_parallel: the native rollout engine"),
    ("rollout.cuda_graphs=false", "rollout.cuda_graphs: unknown key, moved to rollout.native.cuda_graphs (got "
     "'false'). Did you mean 'rollout.native.cuda_graphs'?"),
    ("rollout.attention_backend=fa3",
     "rollout.attention_backend: unknown key, moved to rollout.sglang.attention_backend"),
    ("rollout.sglang.attention_backend=fa3", "rollout.sglang.attention_backend: must be one of triton, flashinfer"),
    ("data.use_sequence_packing=true model.attention_backend=local",
     "model.attention_backend: megatron's local attention cannot run packed sequences (got local"),
    ("rollout", "rollout: an override must look like a.b=value"),
    ("actor=3", "actor: is a section, not a value (got '3')."),
    ("rollout.n.x=3", "rollout.n.x: rollout.n is a value, not a section"),
])
def test_each_bad_field_gets_one_clear_error(override, expected):
    errs = errors_of(override.split(" "))
    assert any(e.startswith(expected) for e in errs), errs


def test_world_size_rules():
    errs = errors_of(["parallel.tp=2", "parallel.pp=2"], world_size=6)
    assert any(e.startswith("parallel.tp: tp*pp = 4 must divide the world size 6") for e in errs)
    errs = errors_of(["data.train_batch_size=6", "actor.ppo_mini_batch_size=6", "critic.ppo_mini_batch_size=6"],
                     world_size=4)
    assert any(e.startswith("data.train_batch_size: must be divisible by the data-parallel size 4 (got 6)")
               for e in errs)


def test_all_errors_are_reported_together():
    errs = errors_of(["rollout.n=two", "actor.optim.lr=fast", "bogus.key=1"])
    assert len(errs) == 3


def test_hf_path_without_inline_fields(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6, '
                                          '"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 48, '
                                          '"intermediate_size": 96, "vocab_size": 256}')
    blank = ["model.num_layers=null", "model.hidden_size=null", "model.ffn_hidden_size=null",
             "model.num_attention_heads=null", "model.num_query_groups=null", "model.vocab_size=null"]
    cfg = load_config(TINY, blank + [f"model.hf_path={tmp_path}", "parallel.tp=3", "parallel.pp=2",
                                     "model.make_vocab_size_divisible_by=384"])
    assert cfg.parallel.tp == 3
    errs = errors_of(blank + [f"model.hf_path={tmp_path}", "parallel.tp=2"])
    assert errs == ["parallel.tp: must divide the number of KV groups 3 (got 2). Pick a divisor of "
                    "num_key_value_heads."]


@pytest.mark.parametrize("arch, extra, slides", [
    ("MistralForCausalLM", {}, True), ("Qwen2ForCausalLM", {}, False),
    ("Qwen2ForCausalLM", {"use_sliding_window": True, "max_window_layers": 1}, True),
    ("Qwen2ForCausalLM", {"use_sliding_window": True}, False),  # max_window_layers 28 >= 2 layers: none slides
    ("Qwen3ForCausalLM", {"use_sliding_window": True, "layer_types": ["sliding_attention"] * 2}, True),
    ("Qwen3ForCausalLM", {"use_sliding_window": False, "max_window_layers": 0}, False)])
def test_sliding_window_shorter_than_the_sequence_runs_on_sdpa(tmp_path, arch, extra, slides):
    """A window of 8 tokens under prompt + response = 64 validates (models/attention.py applies it; it was
    refused before); a model whose layers slide runs on our SDPA attention only (te / local: one line)."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "sliding_window": 8, "hidden_size": 32,
                                                      "intermediate_size": 64, "vocab_size": 256, **extra}))
    blank = ["model.num_layers=null", "model.hidden_size=null", "model.ffn_hidden_size=null",
             "model.num_attention_heads=null", "model.num_query_groups=null", "model.vocab_size=null",
             f"model.hf_path={tmp_path}", "data.max_prompt_length=16", "rollout.max_response_length=48"]

    def backend_errors(backend):
        try:
            load_config(TINY, blank + [f"model.attention_backend={backend}"])
        except ConfigError as e:
            return [err for err in e.errors if "sliding" in err]
        return []

    assert backend_errors("sdpa") == backend_errors("auto") == []
    assert backend_errors("te") == ([f"model.attention_backend: te is not tested with sliding windows "
                                     f"({tmp_path}/config.json: sliding_window=8) (got te). Use "
                                     "model.attention_backend=sdpa (or auto)."] if slides else [])


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))))
def test_every_shipped_config_validates(path, tmp_path, monkeypatch):
    """Each preset validates as shipped; presets of real models are pointed at a stand-in config.json."""
    import json

    import yaml

    monkeypatch.chdir(ROOT)
    with open(path) as f:
        raw = yaml.safe_load(f)
    overrides = []
    if raw["model"].get("hf_path") and not os.path.isdir(raw["model"]["hf_path"]):  # data/tiny_moe is shipped
        vision = next((v for k, v in VL_SHAPES.items() if k in os.path.basename(path)), None)
        if vision is not None:  # a vision LM: its nested config.json and image processor
            write_vlm_dir(tmp_path, vision, 448)
        else:
            shape = next(v for k, v in HF_SHAPES.items() if k in os.path.basename(path))
            (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **shape}))
        overrides.append(f"model.hf_path={tmp_path}")
        for key in ("train_files", "val_files"):
            (tmp_path / f"{key}.parquet").write_text("")
            overrides.append(f"data.{key}={tmp_path}/{key}.parquet")
    load_config(path, overrides, world_size=8 if "qwen" in path else None)


def test_moved_keys_name_their_new_place(tmp_path):
    """Engine options moved into rollout.<engine>.*: the old name, in a YAML or an override, says where to."""
    from rlhf_mcore.config.schema import MOVED_KEYS

    assert set(MOVED_KEYS.values()) <= set(all_keys()) and not set(MOVED_KEYS) & set(all_keys())
    path = tmp_path / "old.yaml"
    path.write_text("rollout:\n  keep_graphs: false\n  weight_bucket_mb: 64\n")
    assert errors_of([], path=str(path)) == [
        "rollout.keep_graphs: unknown key, moved to rollout.native.keep_graphs (got False). Did you mean "
        "'rollout.native.keep_graphs'? Set that key instead.",
        "rollout.weight_bucket_mb: unknown key, moved to rollout.sglang.weight_bucket_mb (got 64). Did you mean "
        "'rollout.sglang.weight_bucket_mb'? Set that key instead."]


def test_critic_batching_inherits_the_actors_when_unset():
    """As verl's critic config does: unset critic batching keys take the actor's, with a note when a critic
    trains; a key the critic sets stays its own."""
    notes = []
    cfg = load_config(None, ["actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor.micro_batch_size_per_gpu=16",
                             "actor.use_dynamic_bsz=true", "actor.max_tokens_per_gpu=4096",
                             "critic.micro_batch_size_per_gpu=4"], check=False, notes=notes)
    c = cfg.critic
    assert (c.ppo_mini_batch_size, c.micro_batch_size_per_gpu, c.use_dynamic_bsz, c.max_tokens_per_gpu) == (
        64, 4, True, 4096)
    assert notes[-1] == ("critic: unset batching keys take the actor's (ppo_mini_batch_size=64, use_dynamic_bsz=true, "
                         "max_tokens_per_gpu=4096), as in verl; set critic.<key> to choose otherwise")
    notes = []
    load_config(None, ["actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo"], check=False, notes=notes)
    assert notes == []  # no critic is trained: nothing to say


@pytest.mark.parametrize("key", ["model.hf_path", "model.tokenizer", "reward.model_path"])
def test_a_hub_id_is_one_line_with_the_download_command(key):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [f"{key}=Qwen/Qwen2.5-0.5B-Instruct"])
    (line,) = [e for e in info.value.errors if e.startswith(key)]
    assert "If it is a Hugging Face Hub id" in line and \
        "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/Qwen2.5-0.5B-Instruct" in line
