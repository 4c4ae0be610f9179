"""verl keys that have no effect here, each with why (`verl_keys.VERL_KEYS` merges them): FSDP's and the Ray
workers' options, verl's profilers, its inference engines' settings, and the options of kernels we replace."""
from __future__ import annotations

from rlhf_mcore.config.verl_entry import VerlKey, ignored, rejected

_ARR = "actor_rollout_ref"
ROLLOUT_TP = "the native engine decodes in the training layout; SGLang runs inference TP=1 per GPU"
LOGPROB_MB = "forward-only passes use the update's micro-batches (actor.micro_batch_size_per_gpu)"
_ULYSSES = ("Ulysses sequence parallelism is FSDP's; here parallel.tp with parallel.sequence_parallel=true splits "
            "long sequences")
_COMPILE = "verl compiles its entropy and log-prob functions; ours are fused kernels chosen by device"
_ENTROPY = "the entropy is computed in the same pass as the log-probs, from the vocabulary-parallel logits"
_PROFILER = ("verl's profilers (nsys, npu, torch) are not wired in: profile a step with "
             "tools/bench/bench_grpo_step.py --profile FILE")
_CHECKPOINT = ("a checkpoint always holds the weights, optimizer, RNG and data state (resume restores "
               "everything); trainer.export_hf writes HF weights")


NOOP_KEYS: dict[str, VerlKey] = {
    f"{_ARR}.actor.ulysses_sequence_parallel_size": ignored(_ULYSSES, only="1"),
    f"{_ARR}.actor.use_torch_compile": ignored(_COMPILE),
    f"{_ARR}.actor.entropy_from_logits_with_chunking": ignored(_ENTROPY),
    f"{_ARR}.actor.entropy_checkpointing": ignored(_ENTROPY),
    f"{_ARR}.actor.profiler.": ignored(_PROFILER),
    f"{_ARR}.actor.checkpoint.": ignored(_CHECKPOINT),
    f"{_ARR}.rollout.load_format": ignored("the engine gets the current weights in-process after each update, "
                                          "never from disk"),
    f"{_ARR}.rollout.layered_summon": ignored("an FSDP option for syncing LoRA weights; the merged weights sync in "
                                              "buckets here"),
    f"{_ARR}.rollout.multi_stage_wake_up": ignored("engine memory is released and restored around training"),
    f"{_ARR}.rollout.calculate_log_probs": ignored("the rollout's log-probs are always kept (rollout/mismatch_* "
                                                   "metrics, actor.old_log_prob=rollout)"),
    f"{_ARR}.rollout.max_model_len": ignored("the engines size their context from data.max_prompt_length + "
                                             "rollout.max_response_length"),
    f"{_ARR}.rollout.enable_prefix_caching": ignored("SGLang keeps its radix cache; the native engine has none"),
    f"{_ARR}.rollout.data_parallel_size": ignored(ROLLOUT_TP),
    f"{_ARR}.rollout.expert_parallel_size": ignored(ROLLOUT_TP),
    f"{_ARR}.rollout.skip_tokenizer_init": ignored("the engines take token ids; SGLang starts without a tokenizer"),
    f"{_ARR}.rollout.disable_log_stats": ignored("engine statistics are not logged"),
    f"{_ARR}.rollout.over_sample_rate": ignored("a step waits for its samples; partial rollouts "
                                                "(async_training.partial_rollout=true) carry the slowest to the next "
                                                "step instead of dropping them"),
    f"{_ARR}.rollout.checkpoint_engine.": ignored("weights sync in-process in buckets, without a checkpoint engine"),
    f"{_ARR}.rollout.trace.": ignored("rollout tracing is not wired in; trainer.rollout_data_dir writes every "
                                      "sample"),
    f"{_ARR}.rollout.agent.num_workers": ignored("the multi-turn loop runs in the trainer; tools run in "
                                                 "rollout.multi_turn.workers processes"),
    f"{_ARR}.ref.ulysses_sequence_parallel_size": ignored(_ULYSSES, only="1"),
    f"{_ARR}.ref.use_torch_compile": ignored(_COMPILE),
    f"{_ARR}.ref.entropy_from_logits_with_chunking": ignored(_ENTROPY),
    f"{_ARR}.ref.entropy_checkpointing": ignored(_ENTROPY),
    f"{_ARR}.ref.profiler.": ignored(_PROFILER),
    f"{_ARR}.ref.strategy": ignored("the strategy is megatron-core, always"),
    f"{_ARR}.model.use_shm": ignored("the model is read from model.hf_path as it is"),
    f"{_ARR}.model.use_liger": ignored("Liger kernels patch HF models; ours are megatron-core modules"),
    "critic.ulysses_sequence_parallel_size": ignored(_ULYSSES, only="1"),
    "critic.profiler.": ignored(_PROFILER),
    "critic.checkpoint.": ignored(_CHECKPOINT),
    "global_profiler.": ignored(_PROFILER),
    "reward_model.model.": ignored("FSDP options of the reward model have no effect: it runs on the training "
                                   "layout (reward.model_path)"),
    f"{_ARR}.rollout.enforce_eager": ignored("the native engine graphs decode per rollout.native.cuda_graphs"),
    f"{_ARR}.rollout.free_cache_engine": ignored("engine memory is always released during training"),
    f"{_ARR}.rollout.enable_chunked_prefill": ignored("vLLM option"),
    f"{_ARR}.rollout.max_num_batched_tokens": ignored("vLLM option"),
    "trainer.log_val_generations": ignored("validation logs its scores, not its generations"),
    "trainer.device": ignored("the device is CUDA when present, else CPU"),
    "critic.forward_micro_batch_size_per_gpu": ignored(LOGPROB_MB),
    "critic.forward_micro_batch_size": ignored(LOGPROB_MB),
    "reward_model.micro_batch_size_per_gpu": ignored(LOGPROB_MB),
    "reward_model.micro_batch_size": ignored(LOGPROB_MB),
    "reward_model.use_reward_loop": ignored("rewards run in reward workers (reward.num_workers) during the step"),
    "reward_model.rollout.": rejected(
        "a generative reward model served by its own engine is not supported; score with reward.custom_fn (it may "
        "call any service) or a scalar reward model (reward.model_path)"),
    "trainer.use_legacy_worker_impl": ignored("there are no Ray workers: one SPMD program"),
    "data.trust_remote_code": ignored("no remote code runs: tokenizers and processors load from their files"),
    "data.dataloader_num_workers": ignored("prompts are read in the trainer process"),
    "data.filter_overlong_prompts_workers": ignored("overlong prompts are filtered once at start-up"),
}
