"""What each run of `tools/gpu/gpu_presets.sh` learned: one row per run, greedy validation before and after.

    python -m tools.bench.learning_summary --out OUT --runs grpo ppo dapo lora tool [--passk EVAL_DIR/generations]

Reads OUT/<run>_metrics.jsonl (the run's steps and its validations: the first is before training, the last after),
OUT/<run>_val/<step>.jsonl (every validation sample: which problems the run gained and lost) and, with --passk,
the start model's samples at temperature 1 (`rlhf_mcore.evaluate`'s generations: pass@k by the unbiased
estimator). Writes OUT/learning.json and prints a markdown table. A change in accuracy is shown with its standard
error (two independent binomials over the prompts), so "clearly" means more than two of them.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from tools.bench.problem_curve import curve


def val_metric(record: dict, name: str) -> float | None:
    """The mean over data sources of val-core/<source>/<name>/mean@N."""
    found = [v for k, v in record.items() if k.startswith("val-core/") and k.split("/")[-2] == name
             and k.split("/")[-1].startswith("mean@")]
    return sum(found) / len(found) if found else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c right of n samples (Chen et al. 2021).

    >>> round(pass_at_k(4, 1, 2), 4), pass_at_k(4, 0, 4), pass_at_k(4, 4, 1)
    (0.5, 0.0, 1.0)
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def passk_table(records: list[dict]) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, ... up to the samples per prompt, averaged over the prompts."""
    right = defaultdict(list)
    for r in records:
        right[r["input"]].append(r.get("acc", 0.0) >= 1.0)
    if not right:
        return {}
    n = min(len(v) for v in right.values())
    ks = [2 ** i for i in range(int(math.log2(n)) + 1)]
    return {f"pass@{k}": sum(pass_at_k(len(v), sum(v), k) for v in right.values()) / len(right) for k in ks}


def per_problem(before: list[dict], after: list[dict]) -> dict[str, int]:
    """Problems right before / after, and how many were gained and lost (greedy: one sample a prompt)."""
    b = {r["input"]: r.get("acc", 0.0) >= 1.0 for r in before}
    a = {r["input"]: r.get("acc", 0.0) >= 1.0 for r in after}
    both = b.keys() & a.keys()
    return {"prompts": len(both), "right_before": sum(b[p] for p in both), "right_after": sum(a[p] for p in both),
            "gained": sum(a[p] and not b[p] for p in both), "lost": sum(b[p] and not a[p] for p in both)}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def summarize(rows: list[dict], val_dir: Path) -> dict:
    steps = [r for r in rows if "timing_s/step" in r]
    vals = [r for r in rows if val_metric(r, "acc") is not None]
    first = vals[0] if len(vals) >= 2 else {}  # one validation: the after only (trainer.val_before_train=false)
    last = vals[-1] if vals else {}
    seconds = sum(r["timing_s/step"] for r in steps)
    out = {"steps": len(steps), "train_minutes": seconds / 60,
           "s_per_step_median": statistics.median(r["timing_s/step"] for r in steps) if steps else None,
           "peak_memory_gb": max((r.get("perf/max_memory_gb", 0.0) for r in steps), default=None),
           "train_reward_first5": _mean(steps[:5], "critic/score/mean"),
           "train_reward_last5": _mean(steps[-5:], "critic/score/mean"),
           "train_acc_last5": _mean(steps[-5:], "critic/acc/mean"),
           "train_format_last5": _mean(steps[-5:], "critic/format/mean"),
           "response_length_last5": _mean(steps[-5:], "response_length/mean")}
    for name in ("acc", "format", "reward"):
        out[f"val_{name}_before"], out[f"val_{name}_after"] = val_metric(first, name), val_metric(last, name)
    dumps = sorted(val_dir.glob("*.jsonl"), key=lambda p: int(p.stem)) if val_dir.is_dir() else []
    if len(dumps) >= 2:
        out["problems"] = per_problem(read_jsonl(dumps[0]), read_jsonl(dumps[-1]))
        n = out["problems"]["prompts"]
        p0, p1 = out["val_acc_before"] or 0.0, out["val_acc_after"] or 0.0
        out["acc_change_se"] = math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / max(n, 1))
        out["problem_curve"] = curve({int(p.stem): read_jsonl(p) for p in dumps})
    if out["train_minutes"] and out["val_acc_after"] is not None and out["val_acc_before"] is not None:
        out["acc_gain_per_min"] = (out["val_acc_after"] - out["val_acc_before"]) / out["train_minutes"]
        out["format_gain_per_min"] = (out["val_format_after"] - out["val_format_before"]) / out["train_minutes"]
    return out


def _mean(rows: list[dict], key: str) -> float | None:
    found = [r[key] for r in rows if key in r]
    return sum(found) / len(found) if found else None


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def table(results: dict) -> str:
    lines = ["| run | steps | train min | s/step | val acc before -> after (SE) | gained / lost | "
             "val format before -> after | train reward first 5 -> last 5 | peak GB |", "|---" * 9 + "|"]
    for name, r in results.items():
        if name == "start_model":
            continue
        prob = r.get("problems", {})
        lines.append(
            f"| {name} | {r['steps']} | {r['train_minutes']:.2f} | {r['s_per_step_median'] or 0:.2f} | "
            f"{_pct(r['val_acc_before'])} -> {_pct(r['val_acc_after'])} ({_pct(r.get('acc_change_se'))}) | "
            f"{prob.get('gained', '-')} / {prob.get('lost', '-')} | "
            f"{_pct(r['val_format_before'])} -> {_pct(r['val_format_after'])} | "
            f"{r['train_reward_first5'] or 0:.3f} -> {r['train_reward_last5'] or 0:.3f} | "
            f"{r['peak_memory_gb'] or 0:.1f} |")
    if "start_model" in results:
        lines.append("\nStart model, temperature 1.0: " + ", ".join(
            f"{k} {_pct(v)}" for k, v in results["start_model"].items()))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--passk", help="a directory of the start model's sampled validation (N samples a prompt)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    results = {name: summarize(read_jsonl(out / f"{name}_metrics.jsonl"), out / f"{name}_val")
               for name in args.runs}
    passk = sorted(Path(args.passk).glob("*.jsonl")) if args.passk else []
    if passk:
        results["start_model"] = passk_table(read_jsonl(passk[-1]))
    (out / "learning.json").write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
