"""`rollout.mode=single_turn` (the default): one `generate` call, the response is all policy tokens."""
from __future__ import annotations

from rlhf_mcore.rollout.modes.base import ROLLOUT_MODES
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams


@ROLLOUT_MODES.register("single_turn")
def single_turn(engine, prompts, params: SamplingParams, env, show_progress: bool = False) -> RolloutBatch:
    """n samples per prompt in one call; loss_mask = response_mask (`RolloutBatch.__post_init__`). Prompts with
    images (a vision LM) go with their pixels (`env.images`), which the batch carries on to the trainer."""
    ids, images = [list(p.prompt_ids) for p in prompts], env.prompt_images(prompts)
    if images is None:
        return engine.generate(ids, params, show_progress=show_progress)
    return engine.generate(ids, params, show_progress=show_progress, images=images)
