"""The python tool's cost per call: the time from `ToolExecutor.run` to its result for a trivial snippet
(``print(6 * 7)``), one call at a time and a batch through the pool, as multi-turn rollout calls it.

    python -m tools.bench.bench_tool_call --out /tmp/bench --label after
    python -m tools.bench.bench_tool_call --calls 40 --batch 32 --workers 4

Per run: median, p90 and max of `--calls` sequential calls (milliseconds), and the wall time of `--batch`
calls submitted at once to `--workers` threads (calls per second). The first call is a warm-up and not
counted. Writes OUT/tool_call_<label>.json with the figures, the layers the sandbox reported and the
host (cores, kernel, whether it runs as root).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.launch import SandboxLimits, run_sandboxed
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import load_tools

SNIPPET = "print(6 * 7)"


def sequential_ms(ex: ToolExecutor, calls: int) -> list[float]:
    times = []
    for _ in range(calls + 1):
        start = time.perf_counter()
        result = ex.run([ToolCall("python", {"code": SNIPPET})])[0]
        times.append((time.perf_counter() - start) * 1e3)
        if result.error or result.text.strip() != "42":
            raise RuntimeError(f"the benchmark call failed: {result}")
    return times[1:]


def batch_per_s(ex: ToolExecutor, batch: int) -> float:
    start = time.perf_counter()
    results = ex.run([ToolCall("python", {"code": SNIPPET})] * batch)
    wall = time.perf_counter() - start
    if any(r.error for r in results):
        raise RuntimeError(f"a batched call failed: {[r for r in results if r.error][0]}")
    return batch / wall


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with ToolExecutor(load_tools(["python"], None), timeout_s=10, max_output_chars=1024, memory_mb=1024,
                      workers=args.workers) as ex:
        seq = sequential_ms(ex, args.calls)
        rate = batch_per_s(ex, args.batch)
    seq.sort()
    report = {
        "label": args.label, "snippet": SNIPPET, "calls": args.calls, "batch": args.batch, "workers": args.workers,
        "sequential_ms": {"median": statistics.median(seq), "p90": seq[int(0.9 * (len(seq) - 1))],
                          "max": seq[-1]},
        "batch_calls_per_s": rate,
        "layers": run_sandboxed("rlhf_mcore.agent.python_tool:run_python", "python", {"code": "pass"}, {},
                                SandboxLimits(timeout_s=10)).layers,
        "host": {"cores": os.cpu_count(), "kernel": platform.release(), "root": os.geteuid() == 0},
    }
    print(f"tool call ({args.label}): median {report['sequential_ms']['median']:.1f} ms, "
          f"p90 {report['sequential_ms']['p90']:.1f} ms, batch of {args.batch} on {args.workers} workers "
          f"{rate:.1f} calls/s; layers {', '.join(report['layers']) or 'none'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"tool_call_{args.label}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
