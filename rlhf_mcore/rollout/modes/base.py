"""The rollout layer: the one caller of `engine.generate` for training and validation rollouts.

A rollout mode is one function registered in `ROLLOUT_MODES` (config `rollout.mode`) with one signature:

    fn(engine, prompts, params, env: ModeEnv, show_progress) -> RolloutBatch

`prompts` are this DP rank's prompt rows (`.prompt_ids`, `.extra_info`), `params` the step's sampling
parameters (n samples per prompt, the response budget `max_new_tokens`, the step's seed). The batch
has the engine contract's layout (`rlhf_mcore.rollout.base`: row i = sample i % n of prompt i // n)
plus a per-token `loss_mask`, 1 on the tokens the policy sampled. Like `generate`, a mode is collective
over a DP replica's TP/PP ranks: they get identical prompts and make identical calls.

`Rollout` binds a mode to the run's engine and environment once (`build_rollout`); the trainer calls
`rollout.generate(prompts, params)` and nothing else of the engine's sampling.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

from rlhf_mcore.registry import Registry
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams

log = logging.getLogger("rlhf_mcore")

ROLLOUT_MODES: Registry = Registry("rollout mode (rollout.mode)")


@dataclasses.dataclass
class ModeEnv:
    """What a mode needs besides the engine (single_turn needs none of it)."""

    tokenizer: Any = None
    ctx: Any = None  # rlhf_mcore.parallel.ParallelContext (tool results are shared over the replica's ranks)
    options: Any = None  # rollout.multi_turn
    tools: Optional[dict] = None  # name -> rlhf_mcore.agent.tools.Tool
    executor: Any = None  # rlhf_mcore.agent.executor.ToolExecutor (runs on the replica's first rank)
    parse: Optional[Callable[[str], list]] = None  # the tool-call parser (text -> [ToolCall | ParseError])
    stop_strings: tuple[str, ...] = ()  # added to the step's stop strings (the end of a tool call)
    pad_id: int = 0
    sampled_end: str = ""  # turn_end=sampled: the end-of-turn token's text, which the policy writes itself
    # a vision LM's prompts -> per prompt (pixel_values, image_grid_thw) or None (`data.vision_prompt.PromptPixels`)
    images: Optional[Callable[[list], list]] = None

    def prompt_images(self, prompts) -> list | None:
        """Per prompt its (pixel_values, image_grid_thw) or None; None when no prompt has images (a text model)."""
        if self.images is None or not any(getattr(p, "images", ()) for p in prompts):
            return None
        return self.images(prompts)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


class Rollout:
    """`generate(prompts, params)` through the mode `name` on `engine`."""

    def __init__(self, engine, name: str, env: ModeEnv | None = None):
        self.engine, self.name, self.env = engine, name, env or ModeEnv()
        self.fn = ROLLOUT_MODES.get(name)

    def generate(self, prompts, params: SamplingParams, show_progress: bool = False) -> RolloutBatch:
        return self.fn(self.engine, prompts, params, self.env, show_progress)

    def close(self) -> None:
        self.env.close()
