"""Rollout: generation engines (registered in `base.ROLLOUT_ENGINES`), sampling and stop criteria."""
from rlhf_mcore.rollout import native, sglang_engine  # noqa: F401  (register "native" and "sglang")
