"""What a rollout engine must provide, and the registry the trainer builds one from.

An engine is one class registered in `ROLLOUT_ENGINES` with the config sub-section that holds its options
(`@ROLLOUT_ENGINES.register("sglang", section="sglang")` reads `rollout.sglang.*`). The run builds every
engine the same way, `build_rollout_engine(cfg.rollout, setup)` -> `Engine.build(options, setup)`: `options` is
that sub-section, `setup` an `EngineSetup` (the actor's module on this rank, its HF config, the layout,
tokenizer facts and the step's size). An engine imports neither `checkpoint/` nor another engine; the
actor's full weights, from any TP/PP layout, come from `rlhf_mcore.models.full_weights`.

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
`generate`. `update_weights(actor_model)` makes the next `generate` use the actor's current weights and may
return metrics of the refresh (`perf/weight_sync_gb`, ...), logged with the step.
`shutdown()` stops whatever the engine started (server processes); the run calls it once, at the end.

Layouts: `layout_errors(parallel)` (a static method, asked by config validation before anything is built)
returns one error string per training layout setting the engine cannot serve, [] when it can.
`memory_errors(options, num_params, bytes_per_param, device_bytes, kv_bytes)` (static, asked by the start-up
checks before any model is built) returns an error when the engine's own copy of the model cannot fit one device.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Protocol, runtime_checkable

from rlhf_mcore.registry import Registry
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    @classmethod
    def build(cls, options, setup: "EngineSetup") -> "RolloutEngine":
        """The engine from its config sub-section (`options`, rollout.<section>) and the run's `setup`."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 show_progress: bool = False) -> RolloutBatch:
        """n samples per prompt for this DP rank's prompts (collective over the replica; see module doc)."""
        ...

    def update_weights(self, actor_model) -> Optional[dict[str, float]]:
        """Make the next generate() use the actor's current weights (a no-op when they are shared); metrics of
        the refresh to log with the step (e.g. bytes moved), or None."""
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

    @staticmethod
    def memory_errors(options, num_params: int, bytes_per_param: int, device_bytes: int, kv_bytes: int) -> list[str]:
        """Errors when the engine's own copy of the model (`num_params`) and `kv_bytes` of KV cache cannot fit a
        device of `device_bytes` under `options` ([] = fits, or the engine keeps no copy of its own)."""
        ...


@dataclasses.dataclass(frozen=True)
class EngineSetup:
    """What every engine is built from, besides its own options (`rollout.<engine>.*`)."""

    model: object  # the actor's megatron module on this rank (its TP/PP shard; possibly wrapped)
    hf_config: dict  # the actor's architecture as an HF config.json dict
    ctx: object  # rlhf_mcore.parallel.ParallelContext
    pad_id: int
    decode: Optional[Callable[[list[int]], str]]  # ids -> str (stop strings)
    micro_batch_size: int  # rollout.micro_batch_size: sequences decoded together per rank (0 = all)
    replica_rows: int  # sequences one DP replica generates per step (its prompts x rollout.n)
    seed: int  # trainer.seed
    record_routing: bool = False  # actor.router_replay=R3: the batch carries each token's experts (routed_experts)
    hf_dir: str = ""  # model.hf_path: its tokenizer and image processor (a vision LM through SGLang)
    release_cache: str = ""  # why the memory plan frees the native decoder's cache after each rollout ('' = no)


@dataclasses.dataclass(frozen=True)
class EngineTraits:
    section: str  # the rollout.<section> config sub-section holding the engine's options
    requires: tuple[str, ...] = ()  # modules it imports when built (config validation checks they are installed)
    needs_cuda: bool = False  # the start-up checks stop a run without CUDA before any model is built
    records_routing: bool = False  # it returns each token's experts (EngineSetup.record_routing: R3)


ROLLOUT_ENGINES: Registry = Registry("rollout engine", traits=EngineTraits)


def build_rollout_engine(rollout_cfg, setup: EngineSetup) -> RolloutEngine:
    """The engine `rollout_cfg.engine`, built from its own sub-section of `rollout_cfg` and `setup`. Engines
    register on import; `rlhf_mcore/rollout/__init__.py` imports every engine module, so they are all
    registered once anything in `rlhf_mcore.rollout` is imported."""
    engine = ROLLOUT_ENGINES.get(rollout_cfg.engine)
    return engine.build(engine_options(rollout_cfg), setup)


def engine_options(rollout_cfg):
    """The config sub-section of the engine `rollout_cfg.engine` (e.g. rollout.sglang for sglang)."""
    return getattr(rollout_cfg, ROLLOUT_ENGINES.traits(rollout_cfg.engine).section)
