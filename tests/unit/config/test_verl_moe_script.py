"""verl's Qwen3-30B-A3B megatron script (examples/grpo_trainer/run_qwen3moe-30b_megatron.sh: TP4 x PP2 x EP4, vLLM
at TP4, written for 4 nodes of 8) at 32 ranks and at the one node most users start on, where its expert group of 4
spans the 4 TP ranks of a stage (dp 1): the layout loads at both; what stops it is one line each, saying what to
set."""
import importlib.util
import json
import os

import pytest

from rlhf_mcore.config.load import ConfigError, load_config
from tests.support.paths import ROOT_STR as ROOT
from tests.support.shapes import HF_SHAPES

# the script after `main_ppo --config-path=config --config-name=ppo_megatron_trainer.yaml`; paths filled in
VERL_QWEN3_MOE_30B_MEGATRON = (
    "algorithm.adv_estimator=grpo data.train_files={data}/train.parquet data.val_files={data}/test.parquet "
    "data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=2048 "
    "data.filter_overlong_prompts=True data.truncation='error' actor_rollout_ref.model.path={model} "
    "actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64 "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 "
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 "
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 "
    "actor_rollout_ref.actor.megatron.use_dist_checkpointing=True "
    "actor_rollout_ref.actor.megatron.dist_checkpointing_path={model}/dist actor_rollout_ref.actor.use_kl_loss=True "
    "actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl "
    "actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.model.enable_gradient_checkpointing=True "
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.name=vllm "
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5 "
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 "
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 "
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4 "
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size=4 "
    "actor_rollout_ref.ref.megatron.use_dist_checkpointing=True "
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path={model}/dist algorithm.use_kl_in_reward=False "
    "trainer.critic_warmup=0 trainer.logger=['console','wandb'] trainer.project_name='verl_grpo_example_gsm8k_math' "
    "trainer.experiment_name='qwen3_30b_moe_megatron' trainer.n_gpus_per_node=8 trainer.nnodes=4 "
    "trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15"
)
WANDB = importlib.util.find_spec("wandb") is not None
SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.mark.parametrize("world", [8, 32])
def test_verls_qwen3_moe_script_loads_its_layout_at_one_node_and_four(tmp_path, world):
    from rlhf_mcore.train import parse_args

    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-30b-a3b"]))
    script = VERL_QWEN3_MOE_30B_MEGATRON.format(data=os.path.join(ROOT, "data", "tiny"), model=tmp_path)
    args = parse_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", *script.split()])

    def errors(*extra: str) -> list[str]:
        try:
            load_config(args.config, [*args.overrides, *extra], world_size=world)
        except ConfigError as e:
            return [line for line in e.errors if not (line.startswith("trainer.logger: wandb") and not WANDB)]
        return []

    assert errors() == [  # as written: verl turns sequence parallelism on by itself at tp > 1; we ask for it
        "parallel.sequence_parallel: an MoE model at tp > 1 needs sequence parallelism (got false with tp=4; verl's "
        "megatron engine turns it on at tp > 1). Set parallel.sequence_parallel=true with rollout.engine=sglang "
        "(the native engine decodes without it), or split the experts with parallel.ep at tp=1."]
    fixed = ("parallel.sequence_parallel=true", "rollout.engine=sglang")
    assert [line for line in errors(*fixed) if not (line.startswith("rollout.engine: sglang needs") and not SGLANG)
            ] == []  # no parallel.ep line: ep 4 divides tp x dp (4 at one node, 16 at four)
    cfg = load_config(args.config, [*args.overrides, *fixed, "trainer.logger=[console]"], world_size=world,
                      check=False)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep, cfg.rollout.n) == (4, 2, 4, 5)
