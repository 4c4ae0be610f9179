"""verl's keys as aliases: a verl GRPO command line (their examples/grpo_trainer, paths swapped) loads as is,
each key lands on ours with the right value, unsupported keys get one error saying what to use instead."""
import os

import pytest
import yaml

from rlhf_mcore.config import verl_keys
from rlhf_mcore.config.load import ConfigError, all_keys, load_config
from tests.support.paths import ROOT_STR as ROOT
from tests.support.verl import TEST, TRAIN, verl_grpo_command
from tests.unit.agent.test_grading_tools import VERL_GSM8K_CONFIG

TINY = os.path.join(ROOT, "configs", "tiny_grpo.yaml")


def test_verl_command_line_loads_without_a_config_file(verl_model_dir):
    notes: list[str] = []
    cfg = load_config(None, verl_grpo_command(verl_model_dir), world_size=8, notes=notes)
    assert cfg.model.hf_path == str(verl_model_dir)
    assert (cfg.actor.optim.lr, cfg.actor.ppo_mini_batch_size, cfg.actor.micro_batch_size_per_gpu) == (1e-6, 256, 40)
    assert (cfg.actor.use_kl_loss, cfg.actor.kl_loss_coef, cfg.actor.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert cfg.rollout.max_response_length == 1024 and cfg.rollout.n == 5 and cfg.rollout.engine == "native"
    assert cfg.rollout.sglang.gpu_memory_utilization == 0.6
    assert cfg.model.recompute == "full" and cfg.data.use_sequence_packing is True
    assert cfg.trainer.logger == ["console", "jsonl"] and cfg.trainer.total_epochs == 15
    assert "verl key actor_rollout_ref.actor.optim.lr -> actor.optim.lr" in notes
    assert any(n.startswith("verl key trainer.nnodes ignored: ") for n in notes)
    translated = [i.split("=")[0] for i in verl_grpo_command(verl_model_dir) if verl_keys.is_verl_key(i.split("=")[0],
                                                                                                  set(all_keys()))]
    assert len(notes) == len(translated) == 23  # one line per verl key, none for the keys we share (critic_warmup)


def test_verl_yaml_overrides_file_equals_the_command_line(verl_model_dir, tmp_path):
    nested: dict = {}
    for item in verl_grpo_command(verl_model_dir):
        key, value = item.split("=", 1)
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(nested))
    assert load_config(str(path), world_size=8) == load_config(None, verl_grpo_command(verl_model_dir), world_size=8)


def test_unsupported_and_unknown_verl_keys_say_what_to_do():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.optim.lrr=1",
                           "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"], check=False)
    assert info.value.errors == [
        "actor_rollout_ref.actor.ppo_micro_batch_size: not supported here (got '8'). Instead, set "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (verl deprecated the global micro-batch size).",
        "actor_rollout_ref.actor.optim.lrr: unknown verl key (got '1'). Did you mean "
        "'actor_rollout_ref.actor.optim.lr'? See docs/verl.md for the keys we translate.",
        "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size: only None is supported here (got "
        "'2'): virtual pipeline stages are not used: each PP rank holds one chunk. Drop the key."]


def test_our_keys_are_never_translated_and_every_alias_target_exists():
    ours = set(all_keys())
    assert not [k for k in verl_keys.VERL_KEYS if k in ours]
    assert not [t for e in verl_keys.VERL_KEYS.values() for t in e.ours if t not in ours]
    cfg = load_config(None, ["actor_rollout_ref.actor.clip_ratio=0.3"], check=False)
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (0.3, 0.3)


def test_log_prob_token_budgets_land_on_ours():
    """verl's old-policy and reference budgets are one key here (the last one given wins); the log-prob
    micro-batch sizes stay ignored (the forward passes use the update's)."""
    rollout, ref = (f"actor_rollout_ref.{r}.log_prob_max_token_len_per_gpu" for r in ("rollout", "ref"))
    notes: list[str] = []
    cfg = load_config(None, [f"{rollout}=16384", f"{ref}=24576",
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"], check=False, notes=notes)
    assert cfg.actor.log_prob_max_tokens_per_gpu == 24576 and cfg.actor.max_tokens_per_gpu == 0
    assert f"verl key {rollout} -> actor.log_prob_max_tokens_per_gpu" in notes
    assert f"verl key {ref} -> actor.log_prob_max_tokens_per_gpu" in notes
    assert load_config(None, [f"{rollout}=8192"], check=False).actor.log_prob_max_tokens_per_gpu == 8192


@pytest.mark.parametrize("value", ["['a.parquet','b.parquet']", "[a.parquet, b.parquet]", "a.parquet,b.parquet"])
def test_file_lists_in_verl_and_our_forms(value):
    assert load_config(None, [f"data.train_files={value}"], check=False).data.train_files == "a.parquet,b.parquet"


def test_readme_shows_the_table():
    with open(os.path.join(ROOT, "docs", "verl.md")) as f:
        assert verl_keys.markdown_table() in f.read(), "docs/verl.md's verl table is stale: paste markdown_table()"


def test_verl_ppo_quickstart_runs_on_defaults(verl_model_dir):
    """verl's quickstart (PPO, Qwen2.5-0.5B, GSM8K): no adv_estimator, so verl's default gae, with a critic."""
    cfg = load_config(None, [
        f"data.train_files={TRAIN}", f"data.val_files={TEST}", "data.train_batch_size=256",
        "data.max_prompt_length=512", "data.max_response_length=512", f"actor_rollout_ref.model.path={verl_model_dir}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5",
        f"critic.model.path={verl_model_dir}", "critic.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.save_freq=10", "trainer.test_freq=10", "trainer.total_epochs=15"], world_size=1)
    assert cfg.algorithm.adv_estimator == "gae" and cfg.rollout.n == 1
    assert (cfg.critic.optim.lr, cfg.critic.micro_batch_size_per_gpu, cfg.algorithm.kl_coef) == (1e-5, 4, 0.001)


def test_resolved_dump_shows_config_json_values_and_loads_back(verl_model_dir):
    """--validate-only / run_dir/config.yaml: the architecture as config.json sets it, not the unused defaults."""
    from rlhf_mcore.config.load import dump_yaml

    cfg = load_config(None, [f"model.hf_path={verl_model_dir}", "trainer.total_steps=1"], world_size=1)
    text = dump_yaml(cfg)
    assert f"# read from {verl_model_dir}/config.json:" in text and "#   family: qwen2" in text
    assert "#   num_layers: 2" in text and "#   rope_theta: 10000.0" in text and "#   tie_embeddings: false" in text
    assert "\n  num_layers:" not in text  # the ignored inline field is not printed as if it ran
    path = verl_model_dir / "dumped.yaml"
    path.write_text(text)
    assert load_config(str(path), world_size=1) == cfg


def test_save_and_test_freq_say_what_each_value_does():
    notes: list[str] = []
    load_config(None, ["trainer.save_freq=-1"], check=False, notes=notes)
    assert notes == ["trainer.save_freq=-1 saves at the end only (verl's -1 never saves: set 0 for that)"]
    with pytest.raises(ConfigError) as info:
        load_config(os.path.join(ROOT, "configs", "tiny_grpo.yaml"), ["trainer.save_freq=-2", "trainer.test_freq=-3"])
    assert [e.split(":")[0] for e in info.value.errors] == ["trainer.save_freq", "trainer.test_freq"]
    assert "0 (never)" in info.value.errors[0] and "-1 or 0 (never, as verl)" in info.value.errors[1]


@pytest.mark.parametrize("order", [1, -1])
def test_the_dapo_recipe_reward_keys_and_the_custom_reward_function(order):
    """verl's DAPO recipe: the overlong buffer's keys; custom_reward_function.path and .name in either order make
    reward.custom_fn (verl's default function name: compute_score)."""
    custom = ["custom_reward_function.path=data/tiny/reward.py", "custom_reward_function.name=vowel_fraction"]
    cfg = load_config(TINY, custom[::order] + [
        "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=True",
        "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.penalty_factor=0.5"])
    assert cfg.reward.custom_fn == "data/tiny/reward.py:vowel_fraction"
    assert (cfg.reward.overlong_buffer, cfg.reward.overlong_penalty_factor) == (4, 0.5)
    assert load_config(None, custom[:1], check=False).reward.custom_fn == "data/tiny/reward.py:compute_score"
    with pytest.raises(ConfigError, match="reward_model.overlong_buffer.enable: only True is supported"):
        load_config(TINY, ["reward_model.overlong_buffer.enable=False"])


def test_hydra_syntax_of_verls_scripts(tmp_path):
    """`--config-path DIR --config-name NAME`, +key=value, ~key, and a YAML with Hydra's defaults/hydra headers
    (verl's multi-turn example), read with one note."""
    from rlhf_mcore.train import parse_args

    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 256\nactor_rollout_ref:\n  rollout:\n    n: 4\n")
    args = parse_args(["--config-path", str(tmp_path), "--config-name", "gsm8k_multiturn_grpo",
                       "+trainer.total_steps=3", "~data.max_prompt_length", "++rollout.temperature=0.5"])
    assert args.config == str(tmp_path / "gsm8k_multiturn_grpo.yaml")
    late = parse_args(["trainer.resume=auto", "--config-path", str(tmp_path), "--config-name", "x", "a.b=1"])
    assert late.config == str(tmp_path / "x.yaml") and late.overrides == ["trainer.resume=auto", "a.b=1"]  # scripts
    notes = []
    cfg = load_config(args.config, args.overrides, check=False, notes=notes)
    assert (cfg.trainer.total_steps, cfg.rollout.n, cfg.rollout.temperature) == (3, 4, 0.5)
    assert cfg.data.max_prompt_length == load_config(None, [], check=False).data.max_prompt_length  # ~ = default
    assert notes[0].startswith("--config: Hydra's defaults and hydra header skipped")


# verl's examples/grpo_trainer/run_qwen2-7b_math_megatron.sh (its megatron backend), paths swapped: every override
# as the script writes it, after `--config-path=config --config-name='ppo_megatron_trainer.yaml'` (wandb dropped from
# trainer.logger: CI has no wandb package, and a logger that cannot start is refused up front)
MEGATRON_GRPO = [
    "algorithm.adv_estimator=grpo", f"data.train_files=['{TRAIN}']", f"data.val_files=['{TEST}']",
    "data.return_raw_chat=False", "data.train_batch_size=1024", "data.max_prompt_length=1024",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.logger=['console']",
    "trainer.project_name='verl_grpo_example_gsm8k_math'", "trainer.experiment_name='qwen2_7b_megatron'",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15"]


def test_verls_megatron_grpo_script_validates_from_its_config_name(verl_model_dir):
    """The script's first flags name verl's own trainer config: the run starts from our defaults (rlhf_mcore.train
    says so once), and every key of the script translates with no error (TP2 x PP2 on 8 ranks, the reference on the
    actor's layout)."""
    from rlhf_mcore.train import parse_args

    args = parse_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *MEGATRON_GRPO])
    assert args.config is None and args.verl_trainer_config == "ppo_megatron_trainer"
    notes: list[str] = []
    cfg = load_config(None, [*MEGATRON_GRPO, f"actor_rollout_ref.model.path={verl_model_dir}"], world_size=8,
                      notes=notes)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.model.recompute, cfg.rollout.n) == (2, 2, "full", 5)
    assert "verl key actor_rollout_ref.ref.megatron.tensor_model_parallel_size -> parallel.tp" in notes


@pytest.mark.parametrize("name", ["tensor_model_parallel_size", "pipeline_model_parallel_size", "param_offload",
                                  "grad_offload", "optimizer_offload", "virtual_pipeline_model_parallel_size",
                                  "context_parallel_size", "sequence_parallel", "use_distributed_optimizer",
                                  "use_dist_checkpointing", "dist_checkpointing_path", "dist_checkpointing_prefix",
                                  "seed", "override_ddp_config.grad_reduce_in_fp32",
                                  "override_transformer_config.recompute_granularity",
                                  "override_transformer_config.recompute_method",
                                  "override_transformer_config.recompute_num_layers",
                                  "override_transformer_config.attention_backend", "use_mbridge", "dtype",
                                  "expert_model_parallel_size", "expert_tensor_parallel_size", "use_remove_padding",
                                  "override_transformer_config.moe_grouped_gemm"])
@pytest.mark.parametrize("role", ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"])
def test_every_megatron_engine_key_of_every_role_is_known(role, name):
    """verl's engine/megatron.yaml, for each role: translated or ignored with a reason, never 'unknown'."""
    entry = verl_keys.lookup(f"{role}.megatron.{name}")
    assert entry is not None and (entry.ours or entry.note)


def test_a_reference_on_another_layout_is_one_error_that_explains():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                           "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4"], world_size=4)
    assert err.value.errors == [
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size: 4, but "
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2: every role runs on one layout here (one "
        "process group; verl can give each role its own). Set both to one value (parallel.tp)."]


# verl's recipe/dapo/test_dapo_megatron_local.sh (DAPO on its megatron backend), shell variables resolved as the
# script sets them; paths and sizes swapped for the 2-layer model (TP4 x PP4 -> 2 x 2, 2k + 8k tokens -> 1k + 2k),
# wandb dropped from the logger as above
DAPO_MEGATRON = [
    f"data.train_files={TRAIN}", f"data.val_files=['{TEST}']", "data.prompt_key=prompt", "data.truncation='left'",
    "data.max_prompt_length=1024", "data.max_response_length=2048", "data.train_batch_size=256",
    "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10", "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.megatron.param_offload=True",
    "actor_rollout_ref.actor.megatron.optimizer_offload=True", "actor_rollout_ref.actor.megatron.grad_offload=True",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.optim.clip_grad=1.0", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80", "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True", "actor_rollout_ref.rollout.max_num_batched_tokens=3072",
    "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7", "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True", "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.ref.megatron.param_offload=True",
    "reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=1024",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False", "+reward_model.reward_kwargs.max_resp_len=2048",
    "trainer.logger=['console']", "trainer.project_name=DAPO", "trainer.experiment_name=DAPO-Qwen2.5-7b-MATH-megatron",
    "trainer.n_gpus_per_node=16", "trainer.nnodes=1", "trainer.val_before_train=False", "trainer.test_freq=10",
    "trainer.save_freq=10", "trainer.total_epochs=10", "trainer.default_local_dir=/tmp/ckpts/DAPO",
    "trainer.resume_mode=disable", "trainer.log_val_generations=10"]


def test_verls_dapo_megatron_recipe_validates(verl_model_dir):
    notes: list[str] = []
    cfg = load_config(None, [*DAPO_MEGATRON, f"actor_rollout_ref.model.path={verl_model_dir}"], world_size=4,
                      notes=notes)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.rollout.max_response_length, cfg.rollout.n) == (2, 2, 2048, 2)
    assert (cfg.reward.overlong_buffer, cfg.reward.overlong_penalty_factor) == (1024, 1.0)
    assert (cfg.rollout.val_top_p, cfg.rollout.val_do_sample, cfg.actor.clip_ratio_high) == (0.7, True, 0.28)


def test_verls_multi_turn_gsm8k_script_and_yaml(tmp_path, verl_model_dir):
    """examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh with its config/gsm8k_multiturn_grpo.yaml (Hydra
    headers and all), paths swapped: every key translates, tool_config_path to our built-in of verl's Gsm8kTool."""
    from rlhf_mcore.train import parse_args

    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 1024\n  max_response_length: 1024\n  train_batch_size: 256\n"
        "  return_raw_chat: True\nactor_rollout_ref:\n  hybrid_engine: True\n  rollout:\n    name: sglang\n"
        "    multi_turn:\n      enable: True\n      max_assistant_turns: 5\n")
    script = [
        "algorithm.adv_estimator=grpo", "data.train_batch_size=256", "data.max_prompt_length=1024",
        "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation='error'",
        "data.return_raw_chat=True", f"actor_rollout_ref.model.path={verl_model_dir}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=sglang_async",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "actor_rollout_ref.rollout.n=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.logger=['console']",
        "trainer.project_name='gsm8k_async_rl'", "trainer.experiment_name='qwen2.5-3b'", "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=20", f"data.train_files={TRAIN}",
        f"data.val_files={TEST}", "trainer.total_epochs=15"]
    args = parse_args(["--config-path", str(tmp_path), "--config-name", "gsm8k_multiturn_grpo", *script])
    # verl's tool config (its gsm8k_tool_config.yaml: the Gsm8kTool class), and the native engine: no sglang on a CPU
    (tmp_path / "gsm8k_tool_config.yaml").write_text(VERL_GSM8K_CONFIG)
    here = [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'gsm8k_tool_config.yaml'}",
            "rollout.engine=native"]
    notes: list[str] = []
    cfg = load_config(args.config, [*args.overrides, *here], world_size=8, notes=notes)
    assert (cfg.rollout.mode, cfg.rollout.n, cfg.rollout.multi_turn.max_turns) == ("multi_turn", 16, 5)
    assert cfg.rollout.multi_turn.tools == ["calc_gsm8k_reward"]  # verl's Gsm8kTool, a built-in here
    assert any(n.startswith("verl key actor_rollout_ref.rollout.name -> rollout.engine=sglang") for n in notes)


# examples/grpo_trainer/run_qwen2_5_vl-3b-megatron.sh (verl's megatron backend, Geometry3K), after `main_ppo` and its
# --config-path/--config-name; paths are filled in, and trainer.logger's wandb is dropped (not installed here)
VERL_QWEN25_VL_3B_MEGATRON = (
    "algorithm.adv_estimator=grpo data.train_files={data}/train.parquet "
    "data.val_files={data}/test.parquet data.train_batch_size=1024 data.max_prompt_length=1024 "
    "data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error' "
    "actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 "
    "actor_rollout_ref.actor.ppo_mini_batch_size=256 "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 "
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
    "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 "
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 "
    "actor_rollout_ref.model.enable_gradient_checkpointing=True "
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm "
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5 "
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1 "
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 "
    "actor_rollout_ref.actor.megatron.use_dist_checkpointing=True "
    "actor_rollout_ref.ref.megatron.use_dist_checkpointing=True "
    "actor_rollout_ref.actor.megatron.dist_checkpointing_path={ckpt} "
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path={ckpt} algorithm.use_kl_in_reward=False "
    "trainer.val_before_train=False trainer.critic_warmup=0 trainer.logger=['console'] "
    "trainer.project_name='verl_grpo_example_gsm8k_math' trainer.experiment_name='qwenvl3b_grpo' "
    "trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 "
    "trainer.total_epochs=15")


def test_verls_qwen2_5_vl_3b_megatron_script_loads_as_is(tmp_path):
    """verl's vision-language megatron script (Qwen2.5-VL-3B on Geometry3K) runs here unchanged on 8 ranks: TP2, the
    dist-checkpoint as the weights to load, GRPO with the low-variance KL loss, 5 samples; the model is a stand-in
    Qwen2.5-VL-3B directory (config.json and image processor, tools/bench/vision_bench.py)."""
    from rlhf_mcore.train import parse_args
    from tools.bench.vision_bench import QWEN25_VL_3B, write_vlm_dir

    model, ckpt = write_vlm_dir(tmp_path / "Qwen2.5-VL-3B-Instruct", QWEN25_VL_3B, 448), tmp_path / "mcore"
    ckpt.mkdir()
    script = VERL_QWEN25_VL_3B_MEGATRON.format(data=os.path.join(ROOT, "data", "shapes"), model=model, ckpt=ckpt)
    args = parse_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *script.split()])
    cfg = load_config(args.config, args.overrides, world_size=8)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.model.hf_path, cfg.model.load) == (2, 1, str(model), str(ckpt))
    assert (cfg.rollout.n, cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, cfg.actor.kl_loss_type) == (
        5, 1024, 256, "low_var_kl")
    assert cfg.model.freeze_vision_tower and cfg.rollout.engine == "native"  # vllm: our native engine


# examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh (verl's Qwen3-VL-30B-A3B on Geometry3K, megatron backend, its
# defaults: TP2 CP2 EP8 on 8 GPUs, vLLM at TP4), after `main_ppo` and its --config-path/--config-name; paths filled
# in, trainer.logger's wandb dropped (not installed here)
VERL_QWEN3_VL_30B_MEGATRON = (
    "algorithm.adv_estimator=grpo data.train_files={data}/train.parquet data.val_files={data}/test.parquet "
    "data.train_batch_size=512 data.max_prompt_length=1024 data.max_response_length=2048 "
    "data.filter_overlong_prompts=True data.truncation='error' actor_rollout_ref.model.path={model} "
    "actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=128 "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 "
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp} "
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp} "
    "actor_rollout_ref.actor.megatron.context_parallel_size={cp} "
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8 "
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 actor_rollout_ref.actor.use_kl_loss=True "
    "actor_rollout_ref.actor.kl_loss_coef=0.01 actor_rollout_ref.actor.kl_loss_type=low_var_kl "
    "actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 "
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.actor.use_dynamic_bsz=True "
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True "
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096 "
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True "
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096 actor_rollout_ref.rollout.name=vllm "
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True "
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.7 actor_rollout_ref.rollout.n=5 "
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.megatron.use_mbridge=True "
    "actor_rollout_ref.actor.megatron.param_offload=True actor_rollout_ref.actor.megatron.optimizer_offload=True "
    "actor_rollout_ref.actor.megatron.grad_offload=True actor_rollout_ref.ref.megatron.param_offload=True "
    "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1 "
    "+actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True "
    "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True "
    "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32 "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_enable_deepep=True "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=flex "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1 "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=True "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_permute_fusion=True "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01 "
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_z_loss_coeff=0.001 "
    "algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console'] "
    "trainer.project_name='verl_grpo_example_geo3k' trainer.experiment_name='qwen3_vl_30b_megatron' "
    "trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15")


def test_verls_qwen3_vl_30b_megatron_script_is_understood_and_its_layout_refused_one_line_each(tmp_path):
    """verl's Qwen3-VL-30B-A3B script: every key is understood (its ref's dynamic batch, vLLM engine kwargs and
    megatron optimizer overrides included); at its defaults (TP2, CP2) what we cannot honour is one line each, naming
    the key and the layout that works; with TP=1 CP=1 (its own variables) it loads: EP8 x DP8, the fused-expert
    vision MoE from model.hf_path (a stand-in directory at the model's shape), verl's batch and KL loss."""
    from rlhf_mcore.config.load import ConfigError
    from rlhf_mcore.train import parse_args
    from tests.support.shapes import HF_SHAPES
    from tools.bench.vision_bench import write_vlm_dir

    model = write_vlm_dir(tmp_path / "Qwen3-VL-30B-A3B-Instruct", HF_SHAPES["qwen3-vl-30b-a3b"], 448)

    def load(tp: int, cp: int):
        script = VERL_QWEN3_VL_30B_MEGATRON.format(data=os.path.join(ROOT, "data", "shapes"), model=model, tp=tp,
                                                   cp=cp, pp=1)
        args = parse_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *script.split()])
        return load_config(args.config, args.overrides, world_size=8)

    with pytest.raises(ConfigError) as err:
        load(2, 2)
    lines = [line.removeprefix("  - ") for line in str(err.value).splitlines()[1:]]
    print("\n".join(lines))
    assert any(line.startswith("parallel.tp: Qwen3-VL-MoE trains at tp=1") for line in lines), lines
    assert all(line.startswith(("parallel.", "data.")) for line in lines), lines  # no unknown verl key
    cfg = load(1, 1)
    assert (cfg.parallel.tp, cfg.parallel.ep, cfg.parallel.cp, cfg.model.hf_path) == (1, 8, 1, str(model))
    assert (cfg.rollout.n, cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, cfg.actor.kl_loss_type,
            cfg.model.recompute) == (5, 512, 128, "low_var_kl", "full")

