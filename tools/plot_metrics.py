"""Plot a run's curves from RUN_DIR/metrics.jsonl into one PNG.

    python -m tools.plot_metrics RUN_DIR [--out RUN_DIR/metrics.png]

Panels: reward, accuracy and format rate (training steps as lines, validation as points per data_source),
response length with its clip ratio, entropy, KL, grad norm, the critic's value loss and explained variance
(PPO runs: shown when logged), and the step time split by every timed phase (stacked).
Needs matplotlib (`pip install matplotlib`, part of the `test` extra).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (panel title, training metric, validation column or None)
PANELS = (
    ("reward", "critic/score/mean", "reward"),
    ("accuracy", "critic/acc/mean", "acc"),
    ("format rate", "critic/format/mean", "format"),
    ("response length", "response_length/mean", None),
    ("entropy", "actor/entropy", None),
    ("KL", "actor/kl", None),
    ("grad norm", "actor/grad_norm", None),
)
CRITIC_PANELS = (("value loss", "critic/vf_loss", None), ("explained variance", "critic/vf_explained_var", None))
TOOL_PANELS = (("turns", "num_turns/mean", None), ("tool calls per sample", "tool_calls/mean", None),
               ("tool-call rate", "tool/call_rate", None), ("tool error rate", "tool/error_rate", None))


def phases_of(rows: list[dict]) -> list[str]:
    """Every timed phase in the rows (`timing_s/<phase>`, not the whole step), in the order first seen.

    >>> phases_of([{"timing_s/gen": 1.0, "timing_s/step": 2.0}, {"timing_s/ref": 0.5, "timing_s/gen": 1.0}])
    ['gen', 'ref']
    """
    seen: dict[str, None] = {}
    for row in rows:
        seen.update({k.split("/", 1)[1]: None for k in row if k.startswith("timing_s/") and k != "timing_s/step"})
    return list(seen)


def load_metrics(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(training rows, validation rows) of a metrics.jsonl: a step's record holds its training metrics, and its
    validation (`val-core/...` keys) when one ran; a record may be both (one record per step)."""
    train, val = [], []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if any(k.startswith("val-core/") for k in row):
                val.append(row)
            if any(not k.startswith(("val-core/", "val-aux/")) and k != "step" for k in row):
                train.append(row)
    return train, val


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold `key`.

    >>> series([{"step": 1, "a": 0.5}, {"step": 2}, {"step": 3, "a": 1.0}], "a")
    ([1, 3], [0.5, 1.0])
    """
    pairs = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in pairs], [v for _, v in pairs]


def val_series(val: list[dict], column: str) -> dict[str, tuple[list[int], list[float]]]:
    """{data_source: (steps, values)} of `val-core/<data_source>/<column>/mean@N` keys.

    >>> val_series([{"step": 0, "val-core/openai/gsm8k/acc/mean@1": 0.1}], "acc")
    {'openai/gsm8k': ([0], [0.1])}
    """
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in val:
        for key, value in row.items():
            parts = key.split("/")
            if key.startswith("val-core/") and len(parts) >= 4 and parts[-2] == column:
                steps, values = out.setdefault("/".join(parts[1:-2]), ([], []))
                steps.append(row["step"])
                values.append(value)
    return out


def plot(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    train, val = load_metrics(run_dir / "metrics.jsonl")
    out = Path(out) if out else run_dir / "metrics.png"
    panels = PANELS + tuple(p for p in CRITIC_PANELS + TOOL_PANELS if any(p[1] in r for r in train))
    num_rows = -(-(len(panels) + 1) // 4)  # the panels and the phase bars, four a row
    fig, axes = plt.subplots(num_rows, 4, figsize=(20, 3.7 * num_rows))
    axes = axes.ravel()
    for ax, (title, key, column) in zip(axes, panels):
        steps, values = series(train, key)
        if steps:
            ax.plot(steps, values, label="train", color="tab:blue")
        if column:
            for source, (vsteps, vvalues) in val_series(val, column).items():
                ax.plot(vsteps, vvalues, "o--", label=f"val {source} (greedy)", color="tab:red")
        if key == "response_length/mean":
            steps, clip = series(train, "response_length/clip_ratio")
            twin = ax.twinx()
            twin.plot(steps, clip, color="tab:gray", alpha=0.6, label="clip ratio")
            twin.set_ylabel("clip ratio")
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    _plot_phases(axes[len(panels)], train)
    for ax in axes[len(panels) + 1:]:
        ax.axis("off")
    fig.suptitle(f"{run_dir.name}: {len(train)} steps, {len(val)} validations")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _plot_phases(ax, train: list[dict]) -> None:
    bottom = [0.0] * len(train)
    steps = [r["step"] for r in train]
    for phase in phases_of(train):
        values = [r.get(f"timing_s/{phase}", 0.0) for r in train]
        if any(values):
            ax.bar(steps, values, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_title("step time by phase (s)")
    ax.set_xlabel("step")
    if steps:
        ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    parser.add_argument("--out", help="PNG path (default RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "metrics.jsonl").is_file():
        print(f"error: {Path(args.run_dir) / 'metrics.jsonl'} not found; run with trainer.logger including jsonl",
              file=sys.stderr)
        return 2
    print(plot(args.run_dir, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
