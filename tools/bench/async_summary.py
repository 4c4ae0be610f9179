"""Sync vs partial rollouts from the runs of `tools/gpu/gpu_async.sh`: one row per variant, ratios to the first.

    python -m tools.bench.async_summary --out OUT --variants sync partial --samples-per-step 512

Reads OUT/<variant>_metrics.jsonl (and OUT/<variant>_util.csv, nvidia-smi's utilization every 0.5 s, if there)
and writes OUT/async.json. Per variant: steps, minutes of training steps, seconds per step, trained samples and
response tokens per minute, rollout tokens per second of generation time (trained response tokens / `timing_s/gen`),
the mean GPU utilization, the staleness and the last step's training accuracy and format, and the greedy
validation accuracy and format at the end.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pick(record: dict, prefix: str, suffix: str) -> float | None:
    found = [v for k, v in record.items() if k.startswith(prefix) and k.endswith(suffix)]
    return sum(found) / len(found) if found else None


def summarize(rows: list[dict], util: list[float], samples_per_step: int) -> dict:
    steps = [r for r in rows if "timing_s/step" in r]
    seconds = sum(r["timing_s/step"] for r in steps)
    samples = samples_per_step * len(steps)
    tokens = sum(r["response_length/mean"] * samples_per_step for r in steps)
    gen = sum(r.get("timing_s/gen", 0.0) for r in steps)
    last = steps[-1] if steps else {}
    val = next((r for r in reversed(rows) if any(k.startswith("val-core/") for k in r)), {})
    return {
        "steps": len(steps), "minutes": seconds / 60, "s_per_step": seconds / max(len(steps), 1),
        "samples_per_min": samples / max(seconds / 60, 1e-9), "tokens_per_min": tokens / max(seconds / 60, 1e-9),
        "rollout_tokens_per_s": tokens / max(gen, 1e-9), "gen_frac": gen / max(seconds, 1e-9),
        "gpu_util_mean": sum(util) / len(util) if util else None,
        "response_length_mean": sum(r["response_length/mean"] for r in steps) / max(len(steps), 1),
        "staleness_mean": sum(r.get("async/staleness_mean", 0.0) for r in steps) / max(len(steps), 1),
        "staleness_max": max((r.get("async/staleness_max", 0.0) for r in steps), default=0.0),
        "train_acc_last": _pick(last, "train/", "/acc/mean"),
        "train_format_last": _pick(last, "train/", "/format/mean"),
        "val_acc": _pick(val, "val-core/", "/acc/mean@1"), "val_format": _pick(val, "val-core/", "/format/mean@1"),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--samples-per-step", type=int, required=True, help="data.train_batch_size x rollout.n")
    args = parser.parse_args(argv)
    table = {}
    for name in args.variants:
        rows = [json.loads(x) for x in (args.out / f"{name}_metrics.jsonl").read_text().splitlines() if x.strip()]
        util_file = args.out / f"{name}_util.csv"
        util = [float(x) for x in util_file.read_text().split()] if util_file.exists() else []
        table[name] = summarize(rows, util, args.samples_per_step)
    base = table[args.variants[0]]
    for row in table.values():
        row["x_samples_per_min"] = row["samples_per_min"] / max(base["samples_per_min"], 1e-9)
        row["x_rollout_tokens_per_s"] = row["rollout_tokens_per_s"] / max(base["rollout_tokens_per_s"], 1e-9)
        row["x_s_per_step"] = base["s_per_step"] / max(row["s_per_step"], 1e-9)
    (args.out / "async.json").write_text(json.dumps(table, indent=2) + "\n")
    cols = ["steps", "s_per_step", "x_s_per_step", "samples_per_min", "x_samples_per_min", "rollout_tokens_per_s",
            "x_rollout_tokens_per_s", "gen_frac", "gpu_util_mean", "response_length_mean", "staleness_mean",
            "staleness_max", "train_acc_last", "train_format_last", "val_acc", "val_format"]
    print("| variant | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for name, row in table.items():
        cells = [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return table


if __name__ == "__main__":
    main()
