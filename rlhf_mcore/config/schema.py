"""The experiment schema: nested dataclasses mirrored 1:1 by the YAML files in configs/.

Single-section rules live in each section's `__post_init__` (as `_checks`, collected, never raised one by
one); cross-section rules live in `rlhf_mcore.config.validate.validate`, and so does the one check of every
field that names a registry entry (`registry_fields`: the registry is the list of valid names). Loading,
`a.b=value` overrides and error reporting live in `rlhf_mcore.config.load`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from rlhf_mcore.config.checks import (
    DC,
    LORA_MEGATRON_TARGETS,
    LORA_TARGETS,
    choice,
    in_range,
    non_finite_floats,
    positive,
)
from rlhf_mcore.config.rollout_schema import (  # noqa: F401 - the rollout sections, re-exported
    MOVED_KEYS,
    AsyncTrainingConfig,
    MultiTurnConfig,
    NativeRolloutConfig,
    RolloutConfig,
    SGLangRolloutConfig,
)


def lora_errors(m, p: str) -> list[str]:
    """model.lora_*: rank >= 0, alpha > 0, dropout in [0, 1), target_modules all-linear or known names."""
    import difflib

    errs = positive(f"{p}.lora_rank", m.lora_rank, allow_zero=True) + positive(f"{p}.lora_alpha", m.lora_alpha)
    errs += in_range(f"{p}.lora_dropout", m.lora_dropout, 0.0, 1.0, hi_open=True, fix="Use e.g. 0.05, or 0 for none.")
    names = ["all-linear", *LORA_TARGETS, *LORA_MEGATRON_TARGETS]
    for name in m.target_modules:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            errs.append(f"{p}.target_modules: unknown module {name!r} (got {m.target_modules}).{hint} Use all-linear "
                        f"or a list of {', '.join(LORA_TARGETS)} (or megatron's {', '.join(LORA_MEGATRON_TARGETS)}).")
    if not m.target_modules:
        errs.append(f"{p}.target_modules: empty (got []). Use all-linear or a list of {', '.join(LORA_TARGETS)}.")
    return errs


@dataclass(**DC)
class ModelConfig:
    """The policy architecture. With `hf_path` the architecture comes from its config.json and the
    inline fields below must stay unset; without it they describe a fresh model (tests, tiny runs)."""

    hf_path: str = ""  # HF directory: config.json + tokenizer (+ weights for conversion)
    load: str = ""  # megatron dist-checkpoint of the initial policy (wins over hf_path's weights)
    init: str = "auto"  # auto: model.load, else hf_path's safetensors, else random for an inline model | random
    tokenizer: str = ""  # tokenizer dir or SentencePiece .model ("" = hf_path)
    family: str = "llama"  # model registry name, used when hf_path is empty
    num_layers: Optional[int] = None
    hidden_size: Optional[int] = None
    ffn_hidden_size: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_query_groups: Optional[int] = None
    vocab_size: Optional[int] = None
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    dtype: str = "fp32"  # fp32 | bf16
    attention_backend: str = "auto"  # auto (te if importable, else sdpa) | sdpa | local | te
    sdpa_kernel: str = "auto"  # CUDA SDPA kernel tried first: auto (torch's) | flash | cudnn | efficient | math
    recompute: str = "none"  # none | full | selective
    make_vocab_size_divisible_by: int = 128
    init_std: float = 0.02
    lora_rank: int = 0  # LoRA adapters of this rank on the actor (0 = off: full fine-tuning; rlhf_mcore.models.lora)
    lora_alpha: float = 16.0  # LoRA scale = lora_alpha / lora_rank
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # all-linear | LORA_TARGETS names
    lora_dropout: float = 0.0  # dropout on the LoRA branch's input (training forwards only)
    lora_adapter_path: str = ""  # PEFT adapter directory the actor's adapters start from (models.lora_export)
    moe_aux_loss_coeff: float = 0.0  # MoE load-balancing loss weight (RL usually 0: no loss, no router drift)
    moe_z_loss_coeff: float = 0.0  # MoE router z-loss weight (0: off)
    moe_expert_impl: str = "auto"  # auto (grouped: CUDA bf16 SM90) | sequential | grouped | grouped-reference
    freeze_vision_tower: bool = True  # a vision-language policy's tower + merger: frozen (verl's key) or trained

    def _checks(self, p: str) -> list[str]:
        errs = choice(f"{p}.dtype", self.dtype, ("fp32", "bf16"))
        errs += choice(f"{p}.init", self.init, ("auto", "random"))
        if self.init == "random" and self.load:
            errs.append(f"{p}.init: random contradicts {p}.load (got {self.load!r}). Drop one of them.")
        errs += choice(f"{p}.recompute", self.recompute, ("none", "full", "selective"))
        errs += choice(f"{p}.sdpa_kernel", self.sdpa_kernel, ("auto", "flash", "cudnn", "efficient", "math"))
        errs += positive(f"{p}.make_vocab_size_divisible_by", self.make_vocab_size_divisible_by)
        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                    "vocab_size"):
            if getattr(self, key) is not None:
                errs += positive(f"{p}.{key}", getattr(self, key))
        if self.hidden_size and self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            errs.append(f"{p}.hidden_size: must be divisible by num_attention_heads={self.num_attention_heads} "
                        f"(got {self.hidden_size}). Use a multiple of the head count.")
        if self.num_attention_heads and self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            errs.append(f"{p}.num_query_groups: must divide num_attention_heads={self.num_attention_heads} "
                        f"(got {self.num_query_groups}). Use a divisor of the head count.")
        errs += positive(f"{p}.max_position_embeddings", self.max_position_embeddings)
        errs += positive(f"{p}.rope_theta", self.rope_theta) + positive(f"{p}.norm_eps", self.norm_eps)
        errs += positive(f"{p}.init_std", self.init_std)
        errs += lora_errors(self, p)
        errs += positive(f"{p}.moe_aux_loss_coeff", self.moe_aux_loss_coeff, allow_zero=True)
        errs += positive(f"{p}.moe_z_loss_coeff", self.moe_z_loss_coeff, allow_zero=True)
        errs += choice(f"{p}.moe_expert_impl", self.moe_expert_impl,
                       ("auto", "sequential", "grouped", "grouped-reference"))
        return errs


def ep_fits(world_size: int, tp: int, pp: int, ep: int, cp: int = 1) -> bool:
    """Whether ep ranks can hold one copy of the experts: ep divides the tp x dp (x cp) ranks of a pipeline stage
    (megatron's `initialize_model_parallel`: world % (etp * ep * pp) with etp 1), tp*pp*cp dividing the world."""
    return not world_size % (tp * pp * cp) and not (world_size // (pp * cp)) % ep


@dataclass(**DC)
class ParallelConfig:
    """tp x pp (x cp) model parallelism; dp = world_size / (tp * pp * cp) is derived, never set."""

    tp: int = 1
    pp: int = 1
    cp: int = 1  # reserved: context parallelism is not supported yet
    ep: int = 1  # expert parallelism (MoE models): the experts split over ep of a stage's tp x dp ranks (ep_fits)
    etp: int = 1  # expert tensor parallelism: only 1 (each expert whole on its rank, also at tp > 1)
    sequence_parallel: bool = False  # GPU only (needs a fused norm)
    use_distributed_optimizer: bool = False
    collective_timeout_min: float = 10.0  # a rank waiting longer than this in a collective stops the run

    def _checks(self, p: str) -> list[str]:
        errs = positive(f"{p}.tp", self.tp) + positive(f"{p}.pp", self.pp) + positive(f"{p}.ep", self.ep)
        errs += positive(f"{p}.collective_timeout_min", self.collective_timeout_min)
        if self.cp != 1:
            errs.append(f"{p}.cp: context parallelism is not supported yet (got {self.cp}). Set {p}.cp=1.")
        if self.etp != 1:
            errs.append(f"{p}.etp: expert tensor parallelism is not supported (got {self.etp}); experts are never "
                        f"split over TP. Set {p}.etp=1 and split the experts with {p}.ep.")
        return errs


@dataclass(**DC)
class DataConfig:
    train_files: str = ""  # verl-schema parquet
    val_files: str = ""
    train_batch_size: int = 8  # prompts per step (all DP ranks together)
    val_batch_size: int = 0  # prompts per validation generate call (0 = all at once)
    max_prompt_length: int = 512
    filter_overlong_prompts: bool = True
    shuffle: bool = True
    use_sequence_packing: bool = False  # micro-batches = rows packed back to back, no padding, up to
    #                                     actor.max_tokens_per_gpu tokens (every model pass, every role;
    #                                     0 = auto: micro_batch_size_per_gpu x the longest row, padded's memory)

    def _checks(self, p: str) -> list[str]:
        return positive(f"{p}.train_batch_size", self.train_batch_size) + positive(
            f"{p}.max_prompt_length", self.max_prompt_length) + positive(
            f"{p}.val_batch_size", self.val_batch_size, allow_zero=True)


@dataclass(**DC)
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = off
    lr_warmup_steps: int = 0
    lr_schedule: str = "constant"  # constant | cosine
    min_lr_ratio: float = 0.0

    def _checks(self, p: str) -> list[str]:
        errs = choice(f"{p}.lr_schedule", self.lr_schedule, ("constant", "cosine")) + positive(
            f"{p}.lr", self.lr) + positive(f"{p}.grad_clip", self.grad_clip, allow_zero=True)
        errs += positive(f"{p}.weight_decay", self.weight_decay, allow_zero=True)
        for key in ("adam_beta1", "adam_beta2"):
            errs += in_range(f"{p}.{key}", getattr(self, key), 0.0, 1.0, hi_open=True)
        errs += positive(f"{p}.adam_eps", self.adam_eps)
        errs += positive(f"{p}.lr_warmup_steps", self.lr_warmup_steps, allow_zero=True)
        return errs + in_range(f"{p}.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)


@dataclass(**DC)
class UpdateConfig:
    """How a trained role is updated; actor and critic share it (the schedule of `trainer.phases.update_role`)."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 8  # prompts per optimizer step (x rollout.n samples)
    ppo_epochs: int = 1
    micro_batch_size_per_gpu: int = 2  # samples per forward/backward
    use_dynamic_bsz: bool = False  # pack micro-batches up to max_tokens_per_gpu instead
    max_tokens_per_gpu: int = 0  # token budget of a micro-batch (use_dynamic_bsz, data.use_sequence_packing);
    #                              0 = auto: micro_batch_size_per_gpu x the batch's longest row, the tokens of
    #                              the largest padded micro-batch, so peak memory stays at the padded one's

    def _update_checks(self, p: str) -> list[str]:
        errs = self.optim._checks(f"{p}.optim")
        errs += positive(f"{p}.ppo_mini_batch_size", self.ppo_mini_batch_size)
        errs += positive(f"{p}.micro_batch_size_per_gpu", self.micro_batch_size_per_gpu)
        errs += positive(f"{p}.ppo_epochs", self.ppo_epochs)
        return errs + positive(f"{p}.max_tokens_per_gpu", self.max_tokens_per_gpu, allow_zero=True)


@dataclass(**DC)
class ActorConfig(UpdateConfig):
    log_prob_max_tokens_per_gpu: int = 0  # the forward-only passes' token budget (old/ref log-probs, values, reward
    #                                       model) where max_tokens_per_gpu applies; no backward, so it can be
    #                                       larger (verl's log_prob_max_token_len_per_gpu). 0 = max_tokens_per_gpu
    policy_loss: str = "vanilla"  # rlhf_mcore.algorithms.POLICY_LOSSES
    old_log_prob: str = "recompute"  # recompute (a forward pass of the actor) | rollout: the engine's log-probs
    #                                  are pi_old, no pass (exact where they are the trainer's: the native engine,
    #                                  padded; the update's first mini-batch reports rollout/mismatch_*)
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "k3"
    rollout_correction: str = "none"  # none | token | sequence (truncated importance sampling)
    rollout_correction_mode: str = "truncate"  # truncate | mask
    rollout_correction_threshold: float = 2.0
    honor_loss_agg_mode: bool = False  # false = verl: gspo/sapo use seq-mean-token-mean, geo_mean a row mean
    sum_norm_per_seq: bool = False  # seq-mean-token-sum-norm also divides by the sequences (Dr. GRPO); false = verl
    tau_pos: float = 1.0  # sapo: gate temperature for positive advantages
    tau_neg: float = 1.05  # sapo: gate temperature for non-positive advantages
    bypass_loss_type: str = "ppo_clip"  # bypass_mode: ppo_clip | reinforce (IS level: rollout_correction)
    kl_cov_ratio: float = 2e-4  # kl_cov: fraction of valid tokens that get the KL penalty (verl's default)
    kl_cov_coef: float = 0.1  # kl_cov: coefficient of that penalty (verl's policy_loss.ppo_kl_coef)
    router_replay: str = "disabled"  # MoE: disabled | R2 (record the old-log-prob pass's experts, replay them in
    #                                  the update; verl's router_replay.mode) | R3 (the native rollout records each
    #                                  token's experts, prompt and response; old log-prob, ref and update replay them)

    def _checks(self, p: str) -> list[str]:
        errs = self._update_checks(p)
        errs += positive(f"{p}.log_prob_max_tokens_per_gpu", self.log_prob_max_tokens_per_gpu, allow_zero=True)
        errs += positive(f"{p}.tau_pos", self.tau_pos) + positive(f"{p}.tau_neg", self.tau_neg)
        errs += in_range(f"{p}.kl_cov_ratio", self.kl_cov_ratio, 0.0, 1.0, lo_open=True, fix="Use e.g. 0.0002.")
        errs += positive(f"{p}.kl_cov_coef", self.kl_cov_coef, allow_zero=True)
        errs += choice(f"{p}.router_replay", self.router_replay, ("disabled", "R2", "R3"))
        errs += choice(f"{p}.bypass_loss_type", self.bypass_loss_type, ("ppo_clip", "reinforce"))
        errs += choice(f"{p}.old_log_prob", self.old_log_prob, ("recompute", "rollout"))
        errs += positive(f"{p}.clip_ratio_low", self.clip_ratio_low, allow_zero=True)
        errs += positive(f"{p}.clip_ratio_high", self.clip_ratio_high, allow_zero=True)
        if not self.clip_ratio_c > 1.0:
            errs.append(f"{p}.clip_ratio_c: the dual-clip bound must be > 1 (got {self.clip_ratio_c}). Use e.g. 3.0.")
        errs += positive(f"{p}.entropy_coeff", self.entropy_coeff, allow_zero=True)
        errs += positive(f"{p}.kl_loss_coef", self.kl_loss_coef, allow_zero=True)
        return errs + positive(f"{p}.rollout_correction_threshold", self.rollout_correction_threshold)


@dataclass(**DC)
class CriticConfig(UpdateConfig):
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    load: str = ""  # megatron dist-checkpoint of the critic ("" = start from the actor's weights)
    lora_rank: int = 0  # LoRA on the critic (0 = full fine-tuning); alpha, targets and dropout are model.lora_*
    cliprange_value: float = 0.5
    loss_agg_mode: str = ""  # "" = actor.loss_agg_mode, as verl's critic.yaml; token-mean whatever the actor's
    # the value head of a critic built from the actor (no critic.load): zeros (every value starts at 0, so the first
    # advantages are the returns) or normal (random, std model.init_method_std: verl's; values start as noise whose
    # spread can hide a small reward for dozens of steps)
    value_head_init: str = "zeros"

    def _checks(self, p: str) -> list[str]:
        return self._update_checks(p) + positive(f"{p}.cliprange_value", self.cliprange_value) + positive(
            f"{p}.lora_rank", self.lora_rank, allow_zero=True) + choice(
            f"{p}.value_head_init", self.value_head_init, ("zeros", "normal"))


@dataclass(**DC)
class RefConfig:
    load: str = ""  # "" = a frozen copy of the actor's initial weights

    def _checks(self, p: str) -> list[str]:
        return []


@dataclass(**DC)
class RewardConfig:
    custom_fn: str = ""  # path/to/file.py:function_name (overrides the data_source registry)
    timeout_s: float = 10.0
    num_workers: int = 2
    model_path: str = ""  # HF *ForSequenceClassification dir or mcore checkpoint: a reward model
    overlong_buffer: int = 0  # DAPO soft overlong punishment: tokens before max length (0 = off)
    overlong_penalty_factor: float = 1.0
    format_score: float = 0.0  # verl: the built-in GSM8K/MATH score of a well-formed but wrong answer
    format_penalty: float = 0.0  # subtracted when the response lacks the answer format (0 = off)
    post_answer_penalty: float = 0.0  # subtracted when text follows the first answer line (0 = off)
    answer_format: str = "gsm8k"  # gsm8k (#### <n>) | boxed (\boxed{...})
    max_error_frac: float = 0.5  # stop when more than this fraction of reward calls fails ...
    max_error_steps: int = 3  # ... in this many steps in a row

    def _checks(self, p: str) -> list[str]:
        errs = positive(f"{p}.timeout_s", self.timeout_s) + positive(f"{p}.num_workers", self.num_workers)
        for key in ("format_score", "format_penalty", "post_answer_penalty", "overlong_buffer",
                    "overlong_penalty_factor"):
            errs += positive(f"{p}.{key}", getattr(self, key), allow_zero=True)
        if not self.format_score < 1.0:
            errs.append(f"{p}.format_score: must be below the score of a correct answer, 1.0 (got "
                        f"{self.format_score}). Use a small value such as 0.1.")
        errs += in_range(f"{p}.max_error_frac", self.max_error_frac, 0.0, 1.0)
        return errs + positive(f"{p}.max_error_steps", self.max_error_steps)


FILTER_METRICS = ("acc", "format", "reward", "score", "seq_reward", "seq_final_reward")  # per-sample values


@dataclass(**DC)
class FilterGroupsConfig:
    """algorithm.filter_groups: DAPO's dynamic sampling (verl's keys; `rlhf_mcore.trainer.dynamic_sampling`)."""

    enable: bool = False  # drop groups whose `metric` is equal on all n samples, generate until the batch is full
    metric: str = "acc"  # acc | format | reward (shaped) | score (reward fn's) | seq_reward | seq_final_reward
    max_num_gen_batches: int = 0  # generation rounds a step may take before the run stops; 0 = no limit

    def _checks(self, p: str) -> list[str]:
        return choice(f"{p}.metric", self.metric, FILTER_METRICS) + positive(
            f"{p}.max_num_gen_batches", self.max_num_gen_batches, allow_zero=True)


@dataclass(**DC)
class AlgorithmConfig:
    adv_estimator: str = "gae"  # rlhf_mcore.algorithms.ADVANTAGES (gae: verl's default)
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True  # false = Dr.GRPO
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"  # KL estimator used in the reward
    kl_ctrl_type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    kl_horizon: int = 10000
    returns_through_masked: bool = False  # reinforce_plus_plus: true = returns pass mask-0 tokens; false = verl
    gpg_paper_alpha: bool = False  # gpg: true = alpha B/(B-M) of the paper; false = verl's B/#nonzero scores
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)

    def _checks(self, p: str) -> list[str]:
        errs = in_range(f"{p}.gamma", self.gamma, 0.0, 1.0) + in_range(f"{p}.lam", self.lam, 0.0, 1.0)
        errs += self.filter_groups._checks(f"{p}.filter_groups")
        errs += positive(f"{p}.kl_coef", self.kl_coef, allow_zero=True) + positive(f"{p}.target_kl", self.target_kl)
        return errs + positive(f"{p}.kl_horizon", self.kl_horizon)


@dataclass(**DC)
class TrainerConfig:
    total_steps: int = 0  # 0 = run total_epochs over the train set
    total_epochs: int = 1
    save_freq: int = -1  # -1 = only at the end (verl's -1: never); 0 = never; N = every N steps and at the end
    test_freq: int = -1  # -1 or 0 = never (as verl); N = every N steps and at the end
    val_before_train: bool = False
    critic_warmup: int = 0  # verl's: the first N steps train the critic only (the actor waits for a value baseline)
    val_only: bool = False  # verl's: validate the starting (or resumed) weights once, then stop: no step, no save
    output_dir: str = "runs/default"
    seed: int = 1
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])  # +wandb; console=step line
    project_name: str = "rlhf_mcore"  # wandb project
    experiment_name: str = ""  # wandb run name ("" = the output_dir's name)
    resume: str = "auto"  # auto | disable (refused in a used dir) | restart (moves a used dir's run aside) | <path>
    max_checkpoints_to_keep: int = 2
    offload_during_rollout: bool = False
    time_limit_min: float = 0.0  # stop (validate, save, export) after the step that passes this; 0 = off
    check_memory_plan: bool = True  # GPU: stop at start-up when rlhf_mcore.plan's peak exceeds the device's memory
    export_hf: bool = True  # write the final actor as an HF checkpoint
    max_bad_steps: int = 3  # stop after this many steps in a row whose update was skipped (non-finite)
    rollout_data_dir: str = ""  # every training sample of a step as <dir>/<step>.jsonl (trainer/dumps.py; verl's key)
    validation_data_dir: str = ""  # every validation sample as <dir>/<step>.jsonl (verl's key)
    save_on_signal: bool = True  # SIGTERM/SIGINT: finish the step, save it, exit 7 (rlhf_mcore.trainer.signals)
    repeat_signal_window_s: float = 5.0  # a 2nd signal this soon after the 1st is the same stop (torchrun's forward)
    profile_steps: list[int] = field(default_factory=list)  # steps (1-based) under torch.profiler: <output_dir>/profile
    profile_trace: bool = False  # also write each profiled step's chrome trace (large)

    def _checks(self, p: str) -> list[str]:
        errs = positive(f"{p}.total_steps", self.total_steps, allow_zero=True)
        if self.save_freq < -1:
            errs.append(f"{p}.save_freq: must be -1, 0 or positive (got {self.save_freq}). Use -1 (at the end "
                        "only; verl's -1 saves never), 0 (never) or N (every N steps and at the end).")
        if self.test_freq < -1:
            errs.append(f"{p}.test_freq: must be -1, 0 or positive (got {self.test_freq}). Use -1 or 0 (never, "
                        "as verl) or N (every N steps and at the end).")
        if not self.output_dir.strip():
            errs.append(f"{p}.output_dir: must name a directory (got {self.output_dir!r}). Set e.g. runs/my_run.")
        errs += in_range(f"{p}.seed", self.seed, 0, 2**32 - 1, fix="numpy seeds must fit in 32 bits.")
        errs += positive(f"{p}.max_bad_steps", self.max_bad_steps)
        errs += positive(f"{p}.total_epochs", self.total_epochs)
        errs += positive(f"{p}.max_checkpoints_to_keep", self.max_checkpoints_to_keep)
        errs += positive(f"{p}.time_limit_min", self.time_limit_min, allow_zero=True)
        errs += positive(f"{p}.critic_warmup", self.critic_warmup, allow_zero=True)
        for name in self.logger:
            errs += choice(f"{p}.logger", name, ("console", "jsonl", "tensorboard", "wandb"))
        for s in self.profile_steps:
            errs += positive(f"{p}.profile_steps", s)
        return errs


@dataclass(**DC)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)

    def section_errors(self) -> list[str]:
        """Every single-section rule, collected (a non-finite float is reported instead of its range)."""
        non_finite = [e for f in dataclasses.fields(self) for e in non_finite_floats(getattr(self, f.name), f.name)]
        bad_keys = {e.split(":", 1)[0] for e in non_finite}
        checks = [e for f in dataclasses.fields(self) for e in getattr(self, f.name)._checks(f.name)]
        return non_finite + [e for e in checks if e.split(":", 1)[0] not in bad_keys]
