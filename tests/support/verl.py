"""verl's command lines, as our tests feed them (paths swapped for the tiny data and a tiny model dir)."""
import os

from tests.support.paths import ROOT_STR as ROOT

TRAIN = os.path.join(ROOT, "data", "tiny", "train.parquet")
TEST = os.path.join(ROOT, "data", "tiny", "test.parquet")


def verl_grpo_command(model_dir) -> list[str]:
    """verl's GRPO example (examples/grpo_trainer/run_qwen2-7b.sh), as a shell passes it, paths swapped."""
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={TRAIN}", f"data.val_files={TEST}",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation=error", f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0", "trainer.logger=[console,jsonl]", "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
        "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
    ]
