"""verl's megatron LoRA block (`actor_rollout_ref.model.lora.*`, Megatron-Bridge's fields, as in verl's
ppo_megatron_trainer.yaml) translates to model.lora_*; megatron's linear names are model.target_modules names;
fields we do not implement name the key and the fix."""
import pytest

from rlhf_mcore.config import load_config
from rlhf_mcore.models.lora import expand_targets

ARR = "actor_rollout_ref.model.lora"
# verl's defaults for the block, rank set (ppo_megatron_trainer.yaml)
VERL_BLOCK = [f"{ARR}.type=lora", f"{ARR}.merge=False", f"{ARR}.rank=16", f"{ARR}.alpha=32", f"{ARR}.dropout=0.0",
              f"{ARR}.target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]", f"{ARR}.exclude_modules=[]",
              f"{ARR}.dropout_position=pre", f"{ARR}.lora_A_init_method=xavier", f"{ARR}.lora_B_init_method=zero",
              f"{ARR}.a2a_experimental=False", f"{ARR}.dtype=null", f"{ARR}.adapter_path=null",
              f"{ARR}.freeze_vision_model=True", f"{ARR}.freeze_vision_projection=True",
              f"{ARR}.freeze_language_model=True"]


def test_verls_megatron_lora_block_sets_our_lora_keys():
    cfg = load_config("configs/tiny_grpo.yaml", [*VERL_BLOCK, "critic.model.lora.rank=4"])
    m = cfg.model
    assert (m.lora_rank, m.lora_alpha, m.lora_dropout, m.lora_adapter_path) == (16, 32.0, 0.0, "")
    assert expand_targets(m.target_modules) == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj")
    assert cfg.critic.lora_rank == 4


@pytest.mark.parametrize("override, message", [
    (f"{ARR}.type=dora", f"{ARR}.type: only lora is supported here (got 'dora')"),
    (f"{ARR}.exclude_modules=[router]", f"{ARR}.exclude_modules: only [] is supported here (got '[router]'): list "
                                        "the projections to adapt in model.target_modules."),
    (f"{ARR}.target_modules=[linear_qvk]", "model.target_modules: unknown module 'linear_qvk' (got ['linear_qvk'])."
                                           " Did you mean 'linear_qkv'?"),
])
def test_what_we_do_not_implement_names_the_key_and_the_fix(override, message):
    with pytest.raises(ValueError) as err:
        load_config("configs/tiny_grpo.yaml", [f"{ARR}.rank=8", override])
    assert message in str(err.value)


def test_megatron_names_stand_for_their_projections():
    assert expand_targets(["linear_qkv"]) == ("q_proj", "k_proj", "v_proj")
    assert expand_targets(["linear_proj", "linear_fc1"]) == ("o_proj", "gate_proj", "up_proj")
    assert expand_targets(["linear_fc2", "down_proj"]) == ("down_proj",)


def test_verls_qwen3_moe_megatron_lora_script_at_one_node(tmp_path):
    """verl's examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh (TP2 x PP2 x CP2 x EP4 on one node of 8,
    rank 32 on every linear, experts included): two lines, each saying what to set (context parallelism; the
    MoE's sequence parallelism, which verl turns on by itself); with them it loads, its LoRA on all seven
    projections."""
    import json

    from rlhf_mcore.config.load import ConfigError
    from rlhf_mcore.train import parse_args
    from tests.support.paths import ROOT_STR as ROOT
    from tests.support.shapes import HF_SHAPES

    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    meg = "actor_rollout_ref.actor.megatron"
    script = [
        f"data.train_files={ROOT}/data/tiny/train.parquet", f"data.val_files={ROOT}/data/tiny/test.parquet",
        "data.train_batch_size=128", "data.max_prompt_length=1024", "data.max_response_length=1024",
        "data.truncation='error'", "data.filter_overlong_prompts=True", "data.shuffle=False",
        "algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={tmp_path}",
        "actor_rollout_ref.model.use_fused_kernels=True", f"{ARR}.rank=32", f"{ARR}.alpha=64",
        f"{ARR}.lora_A_init_method=kaiming", "actor_rollout_ref.actor.optim.lr=3e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"{meg}.use_mbridge=True", f"{meg}.vanilla_mbridge=False", "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        f"{meg}.tensor_model_parallel_size=2", f"{meg}.pipeline_model_parallel_size=2",
        f"{meg}.expert_model_parallel_size=4", f"{meg}.context_parallel_size=2",
        f"{meg}.expert_tensor_parallel_size=1", f"{meg}.param_offload=True", f"{meg}.optimizer_offload=True",
        f"{meg}.grad_offload=True", f"+{meg}.override_transformer_config.recompute_method=uniform",
        f"+{meg}.override_transformer_config.recompute_granularity=full",
        f"+{meg}.override_transformer_config.recompute_num_layers=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.25", "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.free_cache_engine=True", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True", "trainer.critic_warmup=0",
        "trainer.logger=['console']", "trainer.project_name=p", "trainer.experiment_name=e",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
        "trainer.total_epochs=15"]
    args = parse_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *script])
    with pytest.raises(ConfigError) as err:
        load_config(args.config, args.overrides, world_size=8)
    assert [line.split(":")[0] for line in err.value.errors] == ["parallel.cp", "parallel.sequence_parallel"]
    assert "Set parallel.cp=1." in err.value.errors[0]
    cfg = load_config(args.config, [*args.overrides, "parallel.cp=1", "parallel.sequence_parallel=true",
                                    "rollout.engine=sglang"], world_size=8, check=False)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep, cfg.model.lora_rank, cfg.model.lora_alpha) == \
        (2, 2, 4, 32, 64.0)
    assert len(expand_targets(cfg.model.target_modules)) == 7
