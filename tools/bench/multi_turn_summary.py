"""Curves and a table from multi-turn (and single-turn) runs' metrics.jsonl (tools/gpu/gpu_multi_turn.sh).

    python -m tools.bench.multi_turn_summary --run multi=RUN_DIR --run single=RUN_DIR2 [...] --out X.json

Per run: per step the reward, accuracy, tool-call rate (samples with a call), tool calls per sample, turns,
tool error and time-out rates, policy-token response length, the rollout/trainer log-prob mismatch over
policy tokens, tokens and per-phase seconds; then per run the means over its steps after the first (the
first holds warm-up), seconds per 1k tokens, and each run's step time per token against the run "single".
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

CURVES = {  # name in the table/JSON -> metric key
    "reward": "critic/score/mean", "acc": "critic/acc/mean", "tool_calls": "tool_calls/mean",
    "call_rate": "tool/call_rate",
    "turns": "num_turns/mean", "turns_max": "num_turns/max", "tool_err": "tool/error_rate",
    "tool_timeout": "tool/timeout_rate", "resp_len": "response_length/mean",
    "mismatch": "rollout/mismatch_logp_abs_diff", "mismatch_exact": "rollout/mismatch_exact_frac",
    "tokens": "perf/total_num_tokens", "gen_s": "timing_s/gen", "reward_s": "timing_s/reward",
    "old_logp_s": "timing_s/old_log_prob", "ref_s": "timing_s/ref", "update_s": "timing_s/update_actor",
    "step_s": "timing_s/step",
}
SHOWN = ("reward", "acc", "call_rate", "tool_calls", "turns", "tool_err", "resp_len", "mismatch", "tokens", "gen_s",
         "old_logp_s", "update_s", "step_s")


def read_steps(run_dir: Path) -> list[dict]:
    """The step records of a run's metrics.jsonl (validation-only records left out)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "critic/score/mean" in r]


def curves(steps: list[dict]) -> dict[str, list]:
    """{name: [value per step]} (None where a step lacks the metric), plus "step"."""
    out = {"step": [r.get("step") for r in steps]}
    out.update({name: [r.get(key) for r in steps] for name, key in CURVES.items()})
    return out


def mean_after_first(values: list) -> float | None:
    """Mean over the steps after the first (all steps when there is one), None values skipped.

    >>> mean_after_first([10.0, 2.0, 4.0]), mean_after_first([5.0]), mean_after_first([None])
    (3.0, 5.0, None)
    """
    kept = [v for v in (values[1:] if len(values) > 1 else values) if v is not None]
    return sum(kept) / len(kept) if kept else None


def table(name: str, c: dict[str, list]) -> str:
    head = f"{name:<7} {'step':>4} " + " ".join(f"{k:>10}" for k in SHOWN)
    fmt = lambda v: f"{v:>10.4g}" if isinstance(v, (int, float)) else f"{'-':>10}"  # noqa: E731
    rows = [f"{'':<7} {s:>4} " + " ".join(fmt(c[k][i]) for k in SHOWN) for i, s in enumerate(c["step"])]
    return "\n".join([head, *rows])


def summarize(runs: dict[str, Path]) -> dict:
    result = {"runs": {}}
    for name, path in runs.items():
        c = curves(read_steps(path))
        result["runs"][name] = {"curves": c, "num_steps": len(c["step"]),
                                "mean_after_first": {k: mean_after_first(v) for k, v in c.items() if k != "step"}}
    means = {n: r["mean_after_first"] for n, r in result["runs"].items()}
    timed = {n: m for n, m in means.items() if m.get("step_s") and m.get("tokens")}
    result["step_s_per_1k_tokens"] = {n: 1000 * m["step_s"] / m["tokens"] for n, m in timed.items()}
    result["gen_s_per_1k_tokens"] = {n: 1000 * (m.get("gen_s") or 0) / m["tokens"] for n, m in timed.items()}
    if "single" in timed:  # each run's step time per token against the single-turn run's
        base = result["step_s_per_1k_tokens"]["single"]
        result["step_time_per_token_vs_single"] = {n: v / base for n, v in result["step_s_per_1k_tokens"].items()
                                                   if n != "single"}
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="name=run_dir (metrics.jsonl inside)")
    parser.add_argument("--out", required=True, help="JSON of the curves and means")
    args = parser.parse_args(argv)
    runs = {item.split("=", 1)[0]: Path(item.split("=", 1)[1]) for item in args.run}
    result = summarize(runs)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, r in result["runs"].items():
        print(table(name, r["curves"]))
        m = r["mean_after_first"]
        print(f"{name}: {r['num_steps']} steps; mean after step 1: " + ", ".join(
            f"{k} {m[k]:.4g}" for k in SHOWN if m.get(k) is not None))
    for key in ("step_s_per_1k_tokens", "gen_s_per_1k_tokens", "step_time_per_token_vs_single"):
        if key in result:
            print(f"{key}: {result[key]}")


if __name__ == "__main__":
    main()
