"""The rollout layer above the engines (`rollout.mode`): `ROLLOUT_MODES`, `Rollout`, `build_rollout`.
See `base.py` for the contract; each mode registers itself in its own module."""
from rlhf_mcore.rollout.modes import multi_turn, single_turn  # noqa: F401  (register the modes)
from rlhf_mcore.rollout.modes.base import ROLLOUT_MODES, ModeEnv, Rollout
from rlhf_mcore.rollout.modes.build import build_rollout

__all__ = ["ROLLOUT_MODES", "ModeEnv", "Rollout", "build_rollout"]
