"""What a rollout engine must provide, and the registry the trainer builds one from.

An engine is constructed with keyword arguments through `build_rollout_engine(name, **kwargs)`. Every
engine receives at least `model` (the actor's megatron module on this rank), `ctx` (the
`ParallelContext`), `pad_id` and `decode` (ids -> str, needed for stop strings); engine-specific options
follow (`micro_batch_size` for "native"; memory settings for an embedded server engine).

The contract of `generate` (what the trainer relies on):
- It is collective: every rank of a DP replica (all its TP and PP ranks) calls it with the same prompts
  and the same `SamplingParams`, and each of them returns the identical `RolloutBatch`.
- `prompts` are this DP rank's prompt token ids (non-empty lists); the batch has len(prompts) * n rows,
  row i being sample i % n of prompt i // n; `tokens` holds prompt then response, right-padded.
- `rollout_logprobs[i, t]` is log_softmax(logits / T)[tokens[i, t]] of the full vocabulary at response
  positions (T = 1 for greedy), before top-k / top-p truncation (`rlhf_mcore.rollout.sampling`), 0 elsewhere.
- A response ends at a stop token (kept), right after the tokens that complete a stop string, or after
  `max_new_tokens`; finish_reasons are "stop" or "length".
- Sampling with the same seed on the same DP rank is reproducible.

Memory: `release_memory()` frees what the engine holds between rollouts (KV cache; weights too, for an
engine that keeps its own copy) so training can use it; `resume_memory()` must be called before the next
`generate`. `update_weights(actor_model)` makes the next `generate` use the actor's current weights.
`shutdown()` stops whatever the engine started (server processes); the run calls it once, at the end.

Layouts: `layout_errors(parallel)` (a static method, asked by config validation before anything is built)
returns one error string per training layout setting the engine cannot serve, [] when it can.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from rlhf_mcore.registry import Registry
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 show_progress: bool = False) -> RolloutBatch:
        """n samples per prompt for this DP rank's prompts (collective over the replica; see module doc)."""
        ...

    def update_weights(self, actor_model) -> None:
        """Make the next generate() use the actor's current weights (a no-op when they are shared)."""
        ...

    def release_memory(self) -> None:
        """Free the engine's memory (KV cache, own weights) before the training phase."""
        ...

    def resume_memory(self) -> None:
        """Undo release_memory(); required before the next generate()."""
        ...

    def shutdown(self) -> None:
        """Stop what the engine started (a no-op for an in-process engine)."""
        ...

    @staticmethod
    def layout_errors(parallel) -> list[str]:
        """Config errors for the `parallel` section settings this engine cannot roll out with ([] = fine)."""
        ...


ROLLOUT_ENGINES: Registry = Registry("rollout engine")


def build_rollout_engine(name: str, **kwargs) -> RolloutEngine:
    """The engine registered as `name` (rollout.engine in the config), constructed with kwargs. Engines
    register on import; `rlhf_mcore/rollout/__init__.py` imports every engine module, so they are all
    registered once anything in `rlhf_mcore.rollout` is imported."""
    return ROLLOUT_ENGINES.get(name)(**kwargs)
