"""The end of `make demo`: reward, format rate and accuracy before and after training, and where things are.

    python -m tools.demo_summary RUN_DIR [--plot PATH]

"Before/after" are the first and last validation of RUN_DIR/metrics.jsonl (greedy, the same prompts), with
the first and last training step (sampled) beside them and how many steps had a learning signal (rewards that
differ within the batch and a non-zero gradient); RUN_DIR/summary.json says where the checkpoint and export are.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

COLUMNS = (("reward", "reward", "critic/score/mean"), ("format rate", "format", "critic/format/mean"),
           ("accuracy", "acc", "critic/acc/mean"))


def before_after(rows: list[dict]) -> list[tuple[str, float, float, float, float]]:
    """(name, validation before, after, first training step, last) per column; nan where missing.

    >>> rows = [{"step": 0, "val-core/g/acc/mean@1": 0.0}, {"step": 1, "critic/acc/mean": 0.25},
    ...         {"step": 2, "critic/acc/mean": 0.5}, {"step": 2, "val-core/g/acc/mean@1": 0.125}]
    >>> before_after(rows)[2]
    ('accuracy', 0.0, 0.125, 0.25, 0.5)
    """
    val = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    train = [r for r in rows if "critic/score/mean" in r or "critic/acc/mean" in r]
    nan = float("nan")
    table = []
    for name, column, train_key in COLUMNS:
        per_val = [_val_mean(r, column) for r in val]
        per_val = [v for v in per_val if v is not None]
        steps = [r[train_key] for r in train if train_key in r]
        table.append((name, per_val[0] if per_val else nan, per_val[-1] if per_val else nan,
                      steps[0] if steps else nan, steps[-1] if steps else nan))
    return table


def signal_steps(rows: list[dict]) -> tuple[int, int]:
    """(training steps with reward std > 0 and grad norm > 0, training steps).

    >>> signal_steps([{"critic/score/std": 0.1, "actor/grad_norm": 1.0}, {"critic/score/std": 0.0,
    ...               "actor/grad_norm": 0.0}, {"val-core/g/acc/mean@1": 0.0}])
    (1, 2)
    """
    steps = [r for r in rows if "critic/score/std" in r]
    return sum(r["critic/score/std"] > 0 and r.get("actor/grad_norm", 0.0) > 0 for r in steps), len(steps)


def _val_mean(row: dict, column: str) -> float | None:
    """Mean over data sources of `val-core/<source>/<column>/mean@N` in one validation row."""
    values = [v for k, v in row.items() if k.startswith("val-core/") and k.split("/")[-2] == column]
    return sum(values) / len(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--plot", default="", help="where the curves were written")
    args = parser.parse_args(argv)
    with open(os.path.join(args.run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with_signal, num_steps = signal_steps(rows)
    print(f"{'':<12} {'validation (greedy)':>22} {f'training ({num_steps} steps, sampled)':>32}")
    print(f"{'':<12} {'before':>10} {'after':>11} {'first step':>16} {'last step':>15}")
    for name, v0, v1, t0, t1 in before_after(rows):
        print(f"{name:<12} {v0:>10.3f} {v1:>11.3f} {t0:>16.3f} {t1:>15.3f}")
    print(f"steps with a learning signal (rewards differ, gradient non-zero): {with_signal} of {num_steps}")
    with open(os.path.join(args.run_dir, "summary.json")) as f:
        summary = json.load(f)
    where = {**{k: summary[k] for k in ("run_dir", "checkpoint", "hf_export", "metrics")},
             "plot": args.plot or "-", "tensorboard": os.path.join(summary["run_dir"], "tensorboard"),
             "config": os.path.join(summary["run_dir"], "config.yaml")}
    for key, value in where.items():
        print(f"  {key:<11} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
