"""verl's script keys beyond the quickstart: the ones verl's example and recipe scripts pass load with a note and
land on ours; a key with one meaningful value takes it in any boolean spelling; keys with no counterpart are one
line each saying what to use."""
import pytest

from rlhf_mcore.config.load import ConfigError, load_config
from tests.support.verl import verl_grpo_command

# Keys of verl's example and recipe scripts (examples/, recipe/ at volcengine/verl b178a3c, used by 2 to 19 scripts
# each) that were "unknown verl key" errors before 2026-12-06, with the values the scripts pass.
SCRIPT_KEYS = {
    "critic.forward_max_token_len_per_gpu": "8192", "reward_model.micro_batch_size_per_gpu": "32",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "1",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "1", "critic.ulysses_sequence_parallel_size": "1",
    "actor_rollout_ref.actor.use_torch_compile": "False", "actor_rollout_ref.ref.use_torch_compile": "False",
    "actor_rollout_ref.rollout.load_format": "safetensors", "actor_rollout_ref.rollout.layered_summon": "True",
    "actor_rollout_ref.rollout.max_model_len": "15000", "actor_rollout_ref.model.use_shm": "True",
    "actor_rollout_ref.rollout.calculate_log_probs": "True", "actor_rollout_ref.rollout.multi_stage_wake_up": "True",
    "actor_rollout_ref.nccl_timeout": "1200", "trainer.use_legacy_worker_impl": "disable",
    "data.trust_remote_code": "True", "reward_model.use_reward_loop": "True", "reward_model.num_workers": "8",
    "actor_rollout_ref.actor.profiler.enable": "True", "global_profiler.tool": "npu",
    "actor_rollout_ref.rollout.expert_parallel_size": "1", "actor_rollout_ref.actor.entropy_checkpointing": "True",
    "actor_rollout_ref.actor.checkpoint.save_contents": "['model','optimizer','extra']",
    "algorithm.rollout_correction.rollout_is": "token", "algorithm.rollout_correction.rollout_is_threshold": "2.0",
    "actor_rollout_ref.rollout.over_sample_rate": "0.1",
}


def test_verls_common_script_keys_load_and_land_on_ours(verl_model_dir):
    """Each loads with a note (none is unknown); the ones with a meaning here set ours."""
    notes: list[str] = []
    cfg = load_config(None, verl_grpo_command(verl_model_dir) + [f"{k}={v}" for k, v in SCRIPT_KEYS.items()],
                      world_size=8, notes=notes)
    assert all(any(n.startswith(f"verl key {k}") for n in notes) for k in SCRIPT_KEYS), notes
    assert cfg.parallel.collective_timeout_min == 20.0  # 1200 s
    assert (cfg.actor.rollout_correction, cfg.actor.rollout_correction_threshold) == ("token", 2.0)
    assert cfg.reward.num_workers == 8 and cfg.actor.log_prob_max_tokens_per_gpu == 8192  # the last budget given


def test_a_key_with_one_meaningful_value_takes_it_in_any_boolean_spelling():
    """Hydra writes booleans as true/false: `only="False"` keys take either (verl's scripts use both)."""
    cfg = load_config(None, ["algorithm.rollout_correction.bypass_mode=false", "actor_rollout_ref.hybrid_engine=true",
                             "algorithm.rollout_correction.rollout_is_batch_normalize=False",
                             "reward.custom_reward_function.path=r.py", "reward.custom_reward_function.name=f"],
                      world_size=1, check=False)
    assert cfg.reward.custom_fn == "r.py:f"  # verl 0.9's place of custom_reward_function
    with pytest.raises(ConfigError, match="bypass_mode: only False is supported here"):
        load_config(None, ["algorithm.rollout_correction.bypass_mode=true"], check=False)


def test_verl_keys_with_no_counterpart_here_say_what_to_use():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
                           "reward_model.rollout.name=vllm", "algorithm.rollout_correction.rollout_rs=token_k1"],
                    check=False)
    assert info.value.errors == [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size: only 1 is supported here (got '4'): Ulysses sequence "
        "parallelism is FSDP's; here parallel.tp with parallel.sequence_parallel=true splits long sequences. Drop the "
        "key.",
        "reward_model.rollout.name: not supported here (got 'vllm'). Instead, a generative reward model served by its "
        "own engine is not supported; score with reward.custom_fn (it may call any service) or a scalar reward model "
        "(reward.model_path).",
        "algorithm.rollout_correction.rollout_rs: only None is supported here (got 'token_k1'): verl's rejection "
        "modes are not ours: actor.rollout_correction_mode=mask zeroes the weights outside the threshold (MIS). Drop "
        "the key."]
