"""The rollout sections of the experiment schema (`rlhf_mcore.config.schema` re-exports them): rollout.* with each
engine's and each mode's own options, and async_training.* (partial rollouts). Same rules as the schema's other
sections: single-section checks in `_checks`, cross-section ones in `rlhf_mcore.config.validate`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlhf_mcore.config.checks import DC, choice, in_range, positive


@dataclass(**DC)
class NativeRolloutConfig:
    """rollout.native: the actor's own megatron modules decode (`rlhf_mcore.rollout.native`)."""

    cuda_graphs: bool = True  # CUDA-graphed decode at tp=pp=1 on a GPU (else eager, logged)
    keep_graphs: bool = True  # keep the static KV cache and graphs between steps (false frees them)
    empty_cache: bool = True  # after each rollout hand the freed KV cache back to the device (torch.cuda.empty_cache);
    #                           false: the trainer phases reuse torch's cached blocks (no cudaMalloc per step)
    compile_decode: bool = True  # torch.compile the graphed decode step (a compile error falls back, logged)
    decode_attention: str = "auto"  # auto | triton (split-KV kernel, fastest) | sdpa; auto = sdpa where a probe
    #                                 finds it bitwise the trainer's attention (exact log-probs), else triton
    static_on_cpu: bool = False  # on a CPU too, decode with the static decoder (eager steps, no graphs): the
    #                              continuous batching of partial rollouts, in tests and on machines without a GPU

    def _checks(self, p: str) -> list[str]:
        return choice(f"{p}.decode_attention", self.decode_attention, ("auto", "triton", "sdpa"))


@dataclass(**DC)
class SGLangRolloutConfig:
    """rollout.sglang: one embedded SGLang engine per GPU (`rlhf_mcore.rollout.sglang_engine`)."""

    gpu_memory_utilization: float = 0.5  # fraction of GPU memory for the engine's weights + KV cache
    attention_backend: str = "triton"  # triton | flashinfer
    cuda_graph_max_bs: int = 0  # largest decode batch with a CUDA graph (0 = the per-GPU rollout batch)
    weight_bucket_mb: int = 512  # weight refresh in buckets of this many MiB
    compile_cache_dir: str = ""  # JIT caches (tvm-ffi, Triton, flashinfer) here ("" = their defaults)
    fp32_lm_head: bool = False  # logits from an fp32 LM head (closer to the trainer's; slower decode)

    def _checks(self, p: str) -> list[str]:
        errs = choice(f"{p}.attention_backend", self.attention_backend, ("triton", "flashinfer"))
        errs += positive(f"{p}.cuda_graph_max_bs", self.cuda_graph_max_bs, allow_zero=True)
        errs += positive(f"{p}.weight_bucket_mb", self.weight_bucket_mb)
        return errs + in_range(f"{p}.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)


# Keys that moved into a sub-section: loading the old name is an error that names the new one.
MOVED_KEYS = {
    "rollout.cuda_graphs": "rollout.native.cuda_graphs",
    "rollout.keep_graphs": "rollout.native.keep_graphs",
    "rollout.compile_decode": "rollout.native.compile_decode",
    **{f"rollout.{k}": f"rollout.sglang.{k}" for k in ("gpu_memory_utilization", "attention_backend",
                                                         "cuda_graph_max_bs", "weight_bucket_mb", "compile_cache_dir",
                                                         "fp32_lm_head")},
}


@dataclass(**DC)
class MultiTurnConfig:
    """rollout.multi_turn: tool calling over several assistant turns (`rollout.mode=multi_turn`;
    `rlhf_mcore.rollout.modes.multi_turn`). verl: actor_rollout_ref.rollout.multi_turn.*."""

    max_turns: int = 4  # assistant turns per sample (verl max_assistant_turns)
    max_tool_calls: int = 1  # tool calls run per assistant turn; more get an error result (verl max_parallel_calls)
    tools: list[str] = field(default_factory=list)  # built-in tools by name (python, calculator) and tools_file's
    tools_file: str = ""  # a .py file of custom tools (rlhf_mcore.agent.tools.load_tools)
    tool_timeout_s: float = 10.0  # wall-clock limit of one tool call
    tool_memory_mb: int = 1024  # memory limit of a sandboxed tool's process (rlimit)
    tool_disk_mb: int = 64  # disk quota of a sandboxed call: its working directory is a tmpfs of this size
    allow_weak_sandbox: bool = False  # run sandboxed tools on a host that cannot contain them (start-up refuses)
    max_tool_response_chars: int = 1024  # tool output cut to this many characters (verl max_tool_response_length)
    parser: str = "hermes"  # tool-call format of the model's text (rlhf_mcore.agent.parsers; verl format)
    workers: int = 4  # tool calls run concurrently
    # how an assistant turn with tool calls ends: "template" (it stops at the parser's end of a call, e.g.
    # </tool_call>, and the chat template's end-of-turn token follows with loss mask 0) or "sampled" (verl's: it runs
    # to the end-of-turn token, which the policy samples and is trained on)
    turn_end: str = "template"

    def _checks(self, p: str) -> list[str]:
        errs = positive(f"{p}.max_turns", self.max_turns) + positive(f"{p}.max_tool_calls", self.max_tool_calls)
        errs += positive(f"{p}.tool_timeout_s", self.tool_timeout_s) + positive(f"{p}.tool_memory_mb",
                                                                               self.tool_memory_mb)
        errs += positive(f"{p}.max_tool_response_chars", self.max_tool_response_chars)
        errs += positive(f"{p}.tool_disk_mb", self.tool_disk_mb)
        if self.turn_end not in TURN_ENDS:
            errs.append(f"{p}.turn_end: must be one of {', '.join(TURN_ENDS)} (got {self.turn_end!r}). "
                        "'template' stops a turn at the end of its tool call; 'sampled' lets the policy write the "
                        "end of its turn.")
        return errs + positive(f"{p}.workers", self.workers)


TURN_ENDS = ("template", "sampled")


@dataclass(**DC)
class RolloutConfig:
    engine: str = "native"  # rlhf_mcore.rollout.ROLLOUT_ENGINES; its options: rollout.<engine>.*
    mode: str = "single_turn"  # rlhf_mcore.rollout.modes.ROLLOUT_MODES: single_turn | multi_turn (tool calls)
    n: int = 1  # samples per prompt
    max_response_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    stop: list[str] = field(default_factory=list)
    val_temperature: float = 0.0  # 0 = greedy
    val_n: int = 1  # validation samples per prompt: metrics mean@N, best@N, worst@N (verl val_kwargs.n)
    val_top_p: float = 1.0  # verl val_kwargs.top_p
    val_top_k: int = -1  # verl val_kwargs.top_k (-1 = off)
    val_do_sample: bool = True  # false = greedy whatever val_temperature says (verl val_kwargs.do_sample)
    micro_batch_size: int = 0  # sequences decoded together per rank (0 = all)
    native: NativeRolloutConfig = field(default_factory=NativeRolloutConfig)  # options of rollout.engine=native
    sglang: SGLangRolloutConfig = field(default_factory=SGLangRolloutConfig)  # options of rollout.engine=sglang
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)  # options of rollout.mode=multi_turn

    def _checks(self, p: str) -> list[str]:
        errs = positive(f"{p}.n", self.n) + positive(f"{p}.max_response_length", self.max_response_length)
        errs += positive(f"{p}.temperature", self.temperature, allow_zero=True)
        if not 0.0 < self.top_p <= 1.0:
            errs.append(f"{p}.top_p: must be in (0, 1] (got {self.top_p}). Use 1.0 to turn nucleus sampling off.")
        if self.top_k == 0 or self.top_k < -1:
            errs.append(f"{p}.top_k: must be -1 (off) or >= 1 (got {self.top_k}). Use -1 to turn it off.")
        errs += positive(f"{p}.val_temperature", self.val_temperature, allow_zero=True)
        errs += positive(f"{p}.val_n", self.val_n)
        errs += positive(f"{p}.micro_batch_size", self.micro_batch_size, allow_zero=True)
        for f in dataclasses.fields(self):  # the engines' option sub-sections (rollout.native, rollout.sglang, ...)
            if dataclasses.is_dataclass(getattr(self, f.name)):
                errs += getattr(self, f.name)._checks(f"{p}.{f.name}")
        return errs


@dataclass(**DC)
class AsyncTrainingConfig:
    """async_training: partial rollouts and bounded off-policy training (`rlhf_mcore.rollout.partial`). verl:
    async_training.* (its fully-async recipe); here in-process, on the training ranks."""

    partial_rollout: bool = False  # a step stops at enough complete groups; unfinished samples carry over
    staleness_threshold: float = 0.0  # versions a token may lag the weights it trains under (rounded up)
    round_tokens: int = 0  # tokens decoded per round between checks for complete groups (0 = auto)
    continuous: bool = True  # refill the slots of finished samples mid-decode (native engine where its static
    #                          decoder runs); false, or another engine: rounds of round_tokens
    max_num_seqs: int = 0  # samples the continuous decode holds at once per DP rank (its KV-cache slots); 0 = one
    #                        step's (the rank's prompts x rollout.n). More keep the decode batch fuller, for memory

    def _checks(self, p: str) -> list[str]:
        errs = [] if self.staleness_threshold >= 0 else [
            f"{p}.staleness_threshold: must be >= 0 (got {self.staleness_threshold}). 0 is synchronous."]
        errs += [] if self.max_num_seqs >= 0 else [
            f"{p}.max_num_seqs: must be >= 0 (got {self.max_num_seqs}). 0 holds one step's samples at once."]
        return errs + ([] if self.round_tokens >= 0 else [
            f"{p}.round_tokens: must be >= 0 (got {self.round_tokens}). 0 picks a quarter of the response budget."])
