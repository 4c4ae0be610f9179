"""What verl itself loads when tools/bench/bench_verl_grpo.py runs it (issue 41): the reward functions named by
`reward.custom_reward_function.{path,name}` and a Ray worker setup hook that ends training at a wall-clock deadline.

- `random_score`: a reward in [0, 1) drawn from the response text (the step job: GRPO needs spread in a group,
  not meaning; ours draws its random rewards the same way, tools/bench/bench_grpo_step.py `RandomScores`).
- `preset_score`: our GSM8K preset's reward (configs/gsm8k_grpo_smollm2.yaml: strict `#### N`, 0.1 for a
  well-formed wrong answer, -0.1 for text after the first answer line), so verl trains on the same signal.
- `install_deadline`: `ray_kwargs.ray_init.runtime_env.worker_process_setup_hook`. Once $BENCH_VERL_TRAIN_MINUTES
  have passed since the first step began (verl's start-up, 4.5-7 minutes on one H200, is reported apart), the
  step that just ended makes the next one verl's last (it then saves its checkpoint, as a run that reached
  `trainer.total_training_steps` does). Our trainer's `trainer.time_limit_min` does the same, from before its
  model build. $BENCH_VERL_END_BY (a Unix time) ends it earlier, so that verl saves its export inside one device
  call whatever its start-up took; ours then trains as long as verl did (`bench_verl_grpo.train_minutes`).
- `batched_logprobs`: without flash-attn (the box has none), verl 0.9.1's `logprobs_from_logits` falls back to
  `logprobs_from_logits_v2`, which loops over rows in Python; its engine passes one row per token, so a log-prob
  pass launches a few kernels per token (162k tokens a step on the real job). With flash-attn, verl uses its
  cross-entropy kernel instead. $BENCH_VERL_LOGPROBS=batched (bench_verl_grpo's default) swaps in the same maths
  over chunks of rows, so verl runs as it would where flash-attn installs; `loop` keeps verl's fallback.
- `setup_worker`: the Ray worker setup hook (`ray_kwargs.ray_init.runtime_env.worker_process_setup_hook`) that
  installs the deadline and the log-prob choice in every verl worker.
"""
from __future__ import annotations

import hashlib
import os
import time

PRESET_FORMAT_SCORE = 0.1
PRESET_POST_ANSWER_PENALTY = 0.1
MINUTES_ENV = "BENCH_VERL_TRAIN_MINUTES"
END_BY_ENV = "BENCH_VERL_END_BY"
LOGPROBS_ENV = "BENCH_VERL_LOGPROBS"
LOGPROBS_CHOICES = ("batched", "loop")  # `batched_logprobs`, or verl's own fallback
LOGPROB_CHUNK_ROWS = 4096  # rows a kernel: 4096 x SmolLM2's 49,152 logits are 0.4 GB in bf16


def random_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """A stable pseudo-random reward in [0, 1) from the text (a hash: no global RNG state in verl's workers).

    >>> random_score("random", "t5 t9", "0") == random_score("random", "t5 t9", "0")
    True
    >>> 0.0 <= random_score("random", "t1", "0") < 1.0
    True
    """
    digest = hashlib.blake2b(str(solution_str).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def preset_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Our preset's GSM8K reward for one response: the strict score with format credit, plus the post-answer
    penalty (rlhf_mcore.rewards, as the trainer combines them).

    >>> preset_score("openai/gsm8k", "6 * 12 = 72\\n#### 72", "72")
    1.0
    >>> preset_score("openai/gsm8k", "#### 71", "72")
    0.1
    >>> round(preset_score("openai/gsm8k", "#### 72\\nand then more", "72"), 6)
    0.9
    """
    from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score
    from rlhf_mcore.rewards.penalties import post_answer_penalty

    score = compute_gsm8k_score(data_source, solution_str, ground_truth, format_score=PRESET_FORMAT_SCORE)["score"]
    return score + post_answer_penalty(solution_str, "gsm8k", PRESET_POST_ANSWER_PENALTY)


def end_at_deadline(trainer, now: float, deadline: float) -> bool:
    """After a step: past the deadline, make the next step the last one (verl's loop reads
    `total_training_steps` at the top of each step). Returns whether it did.

    >>> import types
    >>> t = types.SimpleNamespace(global_steps=7, total_training_steps=1000)
    >>> end_at_deadline(t, now=10.0, deadline=20.0), t.total_training_steps
    (False, 1000)
    >>> end_at_deadline(t, now=30.0, deadline=20.0), t.total_training_steps
    (True, 8)
    """
    if now < deadline:
        return False
    trainer.total_training_steps = min(trainer.total_training_steps, trainer.global_steps + 1)
    return True


def install_deadline() -> None:
    """Ray worker setup hook: once verl's trainer module is imported in this worker (the TaskRunner imports it
    inside its `run`, after this hook), wrap its per-step `_compute_metrics` with `end_at_deadline`. A no-op
    without $BENCH_VERL_TRAIN_MINUTES."""
    minutes, end_by = os.environ.get(MINUTES_ENV), os.environ.get(END_BY_ENV)
    if minutes:
        from rlhf_mcore.import_hooks import after_import

        after_import("verl.trainer.ppo.v1.trainer_base",
                     lambda module: wrap_trainer(module, float(minutes), end_by=float(end_by) if end_by else None))


def wrap_trainer(trainer_base, minutes: float, clock=time.time, end_by: float | None = None) -> None:
    """The deadline is `minutes` after the first step began (that step's end less its `timing_s/step`), or
    `end_by` (a clock time) if that comes first."""
    inner = trainer_base.PPOTrainer._compute_metrics

    def wrapped(self, batch, metrics, timing_raw, global_steps, epoch):
        out = inner(self, batch, metrics, timing_raw, global_steps, epoch)
        now = clock()
        if not hasattr(self, "_bench_train_start"):
            self._bench_train_start = now - timing_raw.get("step", 0.0)
        deadline = min(self._bench_train_start + 60 * minutes, end_by or float("inf"))
        if end_at_deadline(self, now, deadline):
            print(f"bench_verl_grpo: {(now - self._bench_train_start) / 60:.2f} training minutes (of {minutes}) "
                  f"passed after step {global_steps}; step {self.total_training_steps} is the last", flush=True)
        return out

    trainer_base.PPOTrainer._compute_metrics = wrapped


def batched_logprobs(logits, labels, chunk_rows: int = LOGPROB_CHUNK_ROWS):
    """verl 0.9.1's `logprobs_from_logits_v2` maths, `chunk_rows` rows a kernel instead of one: float32/64 logits
    give the label's logit less the row's logsumexp, lower precisions the label's entry of the row's log-softmax
    (in the logits' dtype, as verl's fallback). `logits` (..., vocab), `labels` (...) -> (...)."""
    import torch
    import torch.nn.functional as F

    rows, index = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1, 1)
    parts = []
    for start in range(0, rows.shape[0], chunk_rows):
        chunk, at = rows[start:start + chunk_rows], index[start:start + chunk_rows]
        if chunk.dtype in (torch.float32, torch.float64):
            parts.append(chunk.gather(-1, at).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
        else:
            parts.append(F.log_softmax(chunk, dim=-1).gather(-1, at).squeeze(-1))
    return (torch.cat(parts) if parts else rows.new_zeros(0)).view(labels.shape)


def install_logprobs() -> None:
    """verl's log-prob fallback becomes `batched_logprobs` in this worker, unless $BENCH_VERL_LOGPROBS is `loop`."""
    choice = os.environ.get(LOGPROBS_ENV, LOGPROBS_CHOICES[0])
    if choice not in LOGPROBS_CHOICES:
        raise ValueError(f"${LOGPROBS_ENV}={choice!r}: expected one of {', '.join(LOGPROBS_CHOICES)}")
    if choice == "batched":
        from rlhf_mcore.import_hooks import after_import

        def patch(module):
            module.logprobs_from_logits_v2 = batched_logprobs
            print(f"bench_verl_grpo: verl's log-prob fallback runs {LOGPROB_CHUNK_ROWS} rows a kernel "
                  f"(verl_hooks.batched_logprobs; pid {os.getpid()})", flush=True)
        after_import("verl.utils.torch_functional", patch)


def setup_worker() -> None:
    """Ray worker setup hook: the training deadline (`install_deadline`) and the log-prob choice
    (`install_logprobs`)."""
    install_deadline()
    install_logprobs()
