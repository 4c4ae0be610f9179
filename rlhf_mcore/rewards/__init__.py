"""Rule-based rewards with verl's signature, looked up by data_source, and a batch scorer with time-outs.

The trainer calls ``score_batch(...) -> RewardResult`` once per step; everything else is for tests, tools and
custom reward files.
"""
from rlhf_mcore.rewards import geometry3k, gsm8k, hendrycks_math, math_dapo, shapes  # noqa: F401  (register the built-ins)
from rlhf_mcore.rewards.batch import RewardResult, resolve_reward_fns, score_batch, shared_pool
from rlhf_mcore.rewards.custom import load_custom_reward
from rlhf_mcore.rewards.dispatch import REWARDS, get_reward_fn, register_reward, split_output
from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score, extract_gsm8k_answer
from rlhf_mcore.rewards.hendrycks_math import compute_math_score, extract_boxed_answer, is_math_equiv
from rlhf_mcore.rewards.penalties import (
    FORMAT_CHECKS,
    apply_penalties,
    format_penalties,
    format_penalty,
    overlong_penalties,
    overlong_penalty,
)
from rlhf_mcore.rewards.workers import RewardPool

__all__ = [
    "FORMAT_CHECKS", "REWARDS", "RewardPool", "RewardResult", "apply_penalties", "compute_gsm8k_score",
    "compute_math_score", "extract_boxed_answer", "extract_gsm8k_answer", "format_penalties", "format_penalty",
    "get_reward_fn", "is_math_equiv", "load_custom_reward", "overlong_penalties", "overlong_penalty",
    "register_reward", "resolve_reward_fns", "score_batch", "shared_pool", "split_output",
]
