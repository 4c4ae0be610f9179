"""The memory plan against a run: each phase's predicted peak (`rlhf_mcore.plan.phases`) next to the run's measured
one (`perf/max_memory_gb/<phase>`, CUDA), the largest over its steps.

    python -m tools.bench.memory_plan_check --metrics RUN/metrics.jsonl --config CFG [a.b=value ...] \
        [--name NAME] [--out OUT.json]

The run's own config and overrides, at its layout (one rank). Plan phases map onto the trainer's: rollout = gen,
log_prob = the largest of old_log_prob, ref and values, update = the largest of update_actor and update_critic.
Prints one row per phase (predicted, measured, predicted / measured); --out appends the rows as JSON lines.
"""
from __future__ import annotations

import argparse
import json
import sys

GIB = 2**30
MEASURED = {"rollout": ("gen",), "log_prob": ("old_log_prob", "ref", "values"),
            "update": ("update_actor", "update_critic")}


def measured_peaks(rows: list[dict]) -> dict[str, float]:
    """GiB per plan phase: the largest `perf/max_memory_gb/<trainer phase>` over the steps.

    >>> measured_peaks([{"perf/max_memory_gb/gen": 3.0, "perf/max_memory_gb/ref": 1.0},
    ...                 {"perf/max_memory_gb/gen": 4.0, "perf/max_memory_gb/update_actor": 2.0}])
    {'rollout': 4.0, 'log_prob': 1.0, 'update': 2.0}
    """
    out = {}
    for phase, names in MEASURED.items():
        found = [r[f"perf/max_memory_gb/{n}"] for r in rows for n in names if f"perf/max_memory_gb/{n}" in r]
        if found:
            out[phase] = max(found)
    return out


def compare(cfg, hf: dict, rows: list[dict], gpu_bytes: float = 0.0) -> list[dict]:
    """One record per plan phase: predicted and measured GiB, their ratio and the predicted terms (one rank of
    the config's TP x PP x EP, DP 1)."""
    from rlhf_mcore.plan.params import Shape
    from rlhf_mcore.plan.phases import phase_terms
    from rlhf_mcore.plan.static import Layout

    p = cfg.parallel
    terms = phase_terms(cfg, Shape.of(hf), Layout(p.tp, p.pp, p.ep, 1), gpu_bytes, 0,
                        int(hf.get("num_experts_per_tok") or 1))
    measured = measured_peaks(rows)
    out = []
    for phase, t in terms.items():
        predicted, got = sum(t.values()) / GIB, measured.get(phase)
        out.append({"phase": phase, "predicted_gib": predicted, "measured_gib": got,
                    "ratio": predicted / got if got else None, "terms_gib": {k: v / GIB for k, v in t.items()}})
    return out


def print_comparison(name: str, records: list[dict]) -> None:
    print(f"{name}: phase  predicted GiB  measured GiB  predicted/measured")
    nan = float("nan")
    for r in records:
        got, ratio = r["measured_gib"], r["ratio"]
        print(f"  {r['phase']:<9} {r['predicted_gib']:12.2f}  {got if got is not None else nan:12.2f}  "
              f"{ratio if ratio is not None else nan:8.3f}   " +
              " + ".join(f"{k} {v:.2f}" for k, v in r["terms_gib"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--config", default=None)
    ap.add_argument("--name", default="")
    ap.add_argument("--gpu-memory", type=float, default=0.0, help="GiB (for rollout.engine=sglang's fraction)")
    ap.add_argument("--out", default="")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    from rlhf_mcore.config.load import load_config
    from rlhf_mcore.models.transformer_config import load_hf_config

    cfg = load_config(args.config, overrides, check=False)
    rows = [json.loads(line) for line in open(args.metrics) if line.strip()]
    records = compare(cfg, load_hf_config(cfg.model), rows, args.gpu_memory * GIB)
    print_comparison(args.name or str(args.config), records)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps({"name": args.name, **r}) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
