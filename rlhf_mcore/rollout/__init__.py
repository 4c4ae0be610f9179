"""Rollout: generation engines (registered in `base.ROLLOUT_ENGINES`), sampling and stop criteria."""
from rlhf_mcore.rollout import native  # noqa: F401  (registers "native")
