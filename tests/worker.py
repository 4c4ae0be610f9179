"""The one entry point of every process a test launches, under torchrun or alone:

    python -m tests.worker CASE [ARGS ...] [--then CASE [ARGS ...] ...]

CASE is a row of CASES (its module's `entry(argv)` runs with ARGS). With --then, one launch runs several cases
in turn in one process group: the imports and the gloo rendezvous are paid once, and between cases only
megatron's model-parallel groups are reset, so the next case may pick another TP/PP/EP split of the same world.
Rank 0 prints a marker line before and after each case (with its exit code), so tests.launch.outputs() splits a
launch's output by case. The exit code is the first non-zero one a case returned (a raised exception fails the
launch as usual).
tests/launch.py builds these command lines; docs/testing.md says how to add a case.
"""
from __future__ import annotations

import importlib
import os
import sys

MARK = "[tests.worker]"
# case name -> module under tests/cases/ (each has `entry(argv: list[str]) -> int | None`)
CASES = {
    "checkpoint_resume": "tests.cases.checkpoint_resume",  # exact resume at every layout and optimizer
    "convert_layouts": "tests.cases.convert_layouts",  # HF <-> mcore conversion at TP/PP/EP layouts
    "dynamic_sampling": "tests.cases.dynamic_sampling",  # DAPO dynamic sampling across ranks
    "engine_layouts": "tests.cases.engine_layouts",  # the native engine's weights and rows at TP/PP
    "ep_lockstep": "tests.cases.ep_lockstep",  # unequal micro-batch counts at EP2
    "fused_logprob_tp": "tests.cases.fused_logprob_tp",  # vocab-parallel fused log-prob kernel at TP2
    "hf_load": "tests.cases.hf_load",  # direct HF loading at layouts
    "hostile_tools": "tests.cases.hostile_tools",  # the python tool's sandbox under a table of attacks
    "lora_export": "tests.cases.lora_export",  # LoRA adapters exported at TP2, read by peft
    "metrics_invariance": "tests.cases.metrics_invariance",  # reported metrics at layouts and micro-batchings
    "moe_full_weights": "tests.cases.moe_full_weights",  # MoE FullWeights and HF export at TP x EP
    "moe_logits": "tests.cases.moe_logits",  # MoE logits against transformers at EP
    "multi_turn_ep": "tests.cases.multi_turn_ep",  # multi-turn rollouts in EP lockstep
    "multi_turn_native": "tests.cases.multi_turn_native",  # multi-turn native rollout at TP/PP
    "native_ep": "tests.cases.native_ep",  # native decode at EP2 vs EP1
    "native_rollout": "tests.cases.native_rollout",  # the native engine's checks at a TP/PP layout
    "partial_ep": "tests.cases.partial_ep",  # multi-turn partial rollouts in EP lockstep
    "plan_params": "tests.cases.plan_params",  # the memory plan's parameter count per rank at layouts
    "router_replay": "tests.cases.router_replay",  # routing replay (R2, R3) in the loop
    "sglang_shutdown": "tests.cases.sglang_shutdown",  # SGLang's shutdown spares the resource tracker
    "check_layouts": "tests.cases.check_layouts",  # tools.check_layouts' main (the core layout promise)
    "signal_fault": "tests.cases.signal_fault",  # the trainer, with SIGTERM at exact points
    "train_run": "tests.cases.train_run",  # the trainer's loop, reporting metrics and changed parameters
    "writer_fault": "tests.cases.writer_fault",  # the trainer, with a fault in the checkpoint writer
    "vl_logits": "tests.cases.vl_logits",  # vision LM logits with images against transformers at TP / PP
    "vlm_multi_turn": "tests.cases.vlm_multi_turn",  # a vision LM's multi-turn GRPO steps at TP / PP
}


def split_runs(argv: list[str]) -> list[list[str]]:
    """["a", "1", "--then", "b"] -> [["a", "1"], ["b"]]."""
    runs, current = [], []
    for arg in argv:
        if arg == "--then":
            runs.append(current)
            current = []
        else:
            current.append(arg)
    return [r for r in runs + [current] if r]


def keep_default_group_between_cases() -> None:
    """Cases end with destroy_distributed(); inside a multi-case launch that only resets megatron's groups
    (after a barrier), so the next case re-uses the same gloo group. main() destroys it once at the end."""
    import torch.distributed as dist

    import rlhf_mcore.parallel as parallel

    def reset_only() -> None:
        if dist.is_initialized():
            dist.barrier()
        parallel.reset_model_parallel()

    parallel.destroy_distributed = reset_only


def mark(text: str) -> None:
    """A line on rank 0's stdout around each case, so that tests.launch.outputs() can split one launch's output."""
    if os.environ.get("RANK", "0") == "0":
        print(f"{MARK} {text}", flush=True)


def main(argv: list[str]) -> int:
    runs = split_runs(argv)
    unknown = [r[0] for r in runs if r[0] not in CASES]
    if not runs or unknown:
        print(f"tests.worker: unknown case(s) {unknown}; known: {', '.join(sorted(CASES))}", file=sys.stderr)
        return 2
    if len(runs) > 1:
        keep_default_group_between_cases()
    rc = 0
    for i, (name, *args) in enumerate(runs):
        sys.argv = [f"tests.worker {name}", *args]
        mark(f"begin {i} {name}")
        case_rc = importlib.import_module(CASES[name]).entry(args) or 0
        mark(f"end {i} {name} rc={case_rc}")
        rc = rc or case_rc
    if len(runs) > 1:
        import torch.distributed as dist

        from rlhf_mcore.parallel import reset_model_parallel

        reset_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
