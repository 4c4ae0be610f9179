"""The issue-24 GPU table from what tools/gpu/gpu_moe.sh left in one folder (whatever finished in its time):
moe_step.json (bench_moe_step: the MoE, both expert implementations, and the 2-layer fit), dense.json (the dense
pair), rollout_*.json (bench_rollout: native eager MoE decode per expert implementation) and rc.txt (exit code
of each command). Prints the table and writes summary.json next to them.

    python -m tools.bench.moe_table DIR
"""
from __future__ import annotations

import glob
import json
import os
import sys


def read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def step_rows(result: dict | None) -> list[dict]:
    return [r for r in (result or {}).get("rows", []) if "error" not in r] if result else []


def train_lines(rows: list[dict]) -> list[str]:
    lines = [f"{'model':<14}{'layers':>7}{'params B':>9}{'active B':>9}{'impl':>12}{'phase':>10}{'step s':>9}"
             f"{'tokens/s':>11}{'MFU':>7}{'peak GiB':>10}"]
    for r in rows:
        lines.append(f"{r['model']:<14}{r['layers']:>7}{r['params_b']:>9.3f}{r['active_params_b']:>9.3f}"
                     f"{r['impl']:>12}{r['phase']:>10}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}{r['mfu']:>7.1%}"
                     f"{r['peak_gib']:>10.1f}")
    return lines


def rollout_lines(results: list[dict]) -> list[str]:
    lines = [f"{'rollout':<34}{'path':>7}{'batch':>7}{'new':>5}{'decode tok/s':>14}{'ms/step':>9}{'peak GiB':>10}"]
    for res in results:
        for r in res["rows"]:
            peak = r.get("peak_mem_gib")
            lines.append(f"{res['model']:<34}{res.get('decode_path', '?'):>7}{r['batch']:>7}{r['new_tokens']:>5}"
                         f"{r['decode_tok_s']:>14.0f}{r['ms_per_step']:>9.2f}"
                         f"{peak if peak is None else round(peak, 1)!s:>10}")
    return lines


def summarize(folder: str) -> dict:
    moe, dense = read(os.path.join(folder, "moe_step.json")), read(os.path.join(folder, "dense.json"))
    rollouts = [r for r in (read(p) for p in sorted(glob.glob(os.path.join(folder, "rollout_*.json")))) if r]
    errors = [r for res in (moe, dense) if res for r in res.get("rows", []) if "error" in r]
    rc = open(os.path.join(folder, "rc.txt")).read().split("\n") if os.path.exists(os.path.join(folder, "rc.txt")) \
        else []
    rows = step_rows(moe) + step_rows(dense)
    diff = next((r["logp_max_diff_vs_sequential"] for r in rows if r.get("logp_max_diff_vs_sequential") is not None),
                None)
    summary = {"train": rows, "errors": errors, "rollout": rollouts, "largest_moe": (moe or {}).get("largest_moe"),
               "logp_max_diff_grouped_vs_sequential": diff, "rc": [line for line in rc if line]}
    lines = train_lines(rows) + [f"  {e['model']} {e['layers']} layers: {e['error']}" for e in errors]
    if diff is not None:
        lines.append(f"grouped vs sequential log-probs (same weights): max |diff| = {diff:.3g}")
    largest = summary["largest_moe"]
    if largest:
        how = "measured peaks, 2 layer counts" if "measured_layers" in largest else "estimate only"
        lines.append(f"largest MoE of this shape training on one GPU ({largest['capacity_gib']:.0f} GiB, distributed "
                     f"optimizer): {largest['layers']} layers, {largest['params_b']:.2f} B params "
                     f"({largest['active_params_b']:.2f} B active) [{how}]")
    if rollouts:
        lines += rollout_lines(rollouts)
    lines += [f"exit codes: {' | '.join(summary['rc'])}"]
    print("\n".join(lines))
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    summarize(sys.argv[1])
